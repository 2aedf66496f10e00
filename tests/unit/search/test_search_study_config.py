"""A study remembers the config its trials ran under and refuses a worker with another one.

Regression: rerunning into a study after changing ``search.max_tokens_per_episode`` (or any setting
that shapes a trial's outcome) mixed the old trials in and reported a "feasible" best that broke
the new limit.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from helpers.params import defaults_params
from helpers.search_helpers import searching

from components.config import Config
from components.errors import UserError
from components.search import SearchError, Worker, run_search
from components.search.synthetic import SyntheticTrial

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _cfg(tmp_path: Path, **search: object) -> Config:
    cfg = Config()
    cfg.search = cfg.search.model_copy(update={"out_params": str(tmp_path / "best.yaml"), **search})
    return cfg


def test_joining_a_study_made_under_another_config_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    run_search(searching(_cfg(tmp_path), trials=1), SyntheticTrial(), worker=Worker(storage=url))
    with pytest.raises(SearchError) as caught:
        run_search(searching(_cfg(tmp_path, max_tokens_per_episode=50.0), trials=2), SyntheticTrial(),
                   worker=Worker(storage=url))
    msg = str(caught.value)
    assert isinstance(caught.value, UserError)  # the CLI exits 2 with this one message
    assert "'agent-gspo'" in msg and url in msg
    assert "search.max_tokens_per_episode: 400.0 in the study, 50.0 now" in msg
    assert "search.study_name" in msg and "--storage" in msg  # says how to go on
    study = optuna.load_study(study_name="agent-gspo", storage=url)
    assert len(study.trials) == 1  # nothing was run under the other config


def test_bookkeeping_settings_may_change_between_joins(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    run_search(searching(_cfg(tmp_path), trials=1), SyntheticTrial(), worker=Worker(storage=url))
    cfg = _cfg(tmp_path, trials=9, budget_tokens=10**9, budget_seconds=3600.0, enabled=True,
               out_params=str(tmp_path / "other.yaml"), storage="sqlite:///elsewhere.db")
    cfg.tracking = cfg.tracking.model_copy(update={"uri": "http://u:pw@mlflow:5000", "experiment": "x"})
    cfg.profile = "renamed"
    again = run_search(searching(cfg, trials=2), SyntheticTrial(), worker=Worker(storage=url))
    assert again.n_complete == 2


def test_the_refusal_names_the_storage_without_its_password() -> None:
    from components.search.study_config import ConfigMismatchError, mismatch_error

    err = mismatch_error("agent-gspo", "postgresql+psycopg://u:s3cret@db/optuna", "a" * 64, "b" * 64,
                         {"gspo.lr": 1e-6, "mas.agents": 3}, {"gspo.lr": 2e-6, "mas.agents": 3})
    assert isinstance(err, ConfigMismatchError) and isinstance(err, SearchError)
    assert "s3cret" not in str(err) and "postgresql+psycopg://u:***@db/optuna" in str(err)
    assert "gspo.lr: 1e-06 in the study, 2e-06 now" in str(err) and "mas.agents" not in str(err)


def test_worker_exits_2_on_a_study_of_another_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from components.search import worker

    args = ["--synthetic", "--params", str(defaults_params(tmp_path)), "--storage",
            f"sqlite:///{tmp_path / 'optuna.db'}", "--trials", "1", "--out-params", str(tmp_path / "best.yaml")]
    assert worker.main(args) == 0
    capsys.readouterr()
    assert worker.main([*args, "--override", "search.trial_steps=9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "search.trial_steps: 5 in the study, 9 now" in err[0], err


def test_a_study_from_before_config_hashes_is_adopted_with_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = optuna.storages.InMemoryStorage()
    old = optuna.create_study(storage=storage, study_name="agent-gspo", direction="maximize")
    old.tell(old.ask(), 0.1)  # a trial recorded by an older version: no config hash on the study
    result = run_search(searching(_cfg(tmp_path), trials=2), SyntheticTrial(), worker=Worker(storage=storage))
    assert result.n_complete == 2
    assert "no recorded config" in capsys.readouterr().err
    with pytest.raises(SearchError, match="another config"):  # from now on the study is checked
        run_search(searching(_cfg(tmp_path, dev_items=3), trials=3), SyntheticTrial(), worker=Worker(storage=storage))


def test_a_worker_that_lost_the_race_to_record_its_config_stops(tmp_path: Path) -> None:
    """Two workers with different configs joining a fresh study at the same instant may both see no
    recorded config; the one whose record was overwritten stops before its next trial."""
    from components.search.study_config import STUDY_CONFIG_HASH

    storage = optuna.storages.InMemoryStorage()
    calls: list[int] = []

    def trial_fn(cfg: Config, trial: optuna.Trial) -> object:
        calls.append(trial.number)
        trial.study.set_user_attr(STUDY_CONFIG_HASH, "f" * 64)  # the other worker's record lands now
        return SyntheticTrial()(cfg, trial)

    with pytest.raises(SearchError, match="another config"):
        run_search(searching(_cfg(tmp_path), trials=5), trial_fn, worker=Worker(storage=storage))
    assert calls == [0]


def test_a_trial_run_under_the_losing_config_is_never_the_best(tmp_path: Path, capsys) -> None:
    """Was: the losing worker's trial, already started when the other worker's record landed, completed
    and stayed in the study; the winner's best could be that trial, run under settings it does not have."""
    from components.search.study import TrialOutcome
    from components.search.study_config import STUDY_CONFIG, STUDY_CONFIG_HASH, config_hash, config_view

    storage = optuna.storages.InMemoryStorage()
    winner = _cfg(tmp_path, max_tokens_per_episode=10_000.0)

    def loser_trial(cfg: Config, trial: optuna.Trial) -> TrialOutcome:
        trial.study.set_user_attr(STUDY_CONFIG, config_view(winner))  # the winner's record lands now
        trial.study.set_user_attr(STUDY_CONFIG_HASH, config_hash(winner))
        return TrialOutcome(dev_accuracy=1.0, mean_tokens_per_episode=1.0, tokens_spent=10, seconds=0.0)

    with pytest.raises(SearchError, match="another config"):
        run_search(searching(_cfg(tmp_path), trials=5), loser_trial, worker=Worker(storage=storage))
    capsys.readouterr()
    result = run_search(searching(winner, trials=2), SyntheticTrial(), worker=Worker(storage=storage))
    assert result.best_trial != 0 and result.best_dev_accuracy < 1.0  # the loser's perfect trial is left out
    assert "trial(s) 0 ran under another config" in capsys.readouterr().err


def test_a_worker_whose_record_is_overwritten_during_its_last_trial_writes_no_best(tmp_path: Path) -> None:
    """With one trial to run there is no next trial to stop before: the loser must still exit with the
    refusal, not write the other config's best (or none) as its result."""
    from components.search.study_config import STUDY_CONFIG_HASH

    storage = optuna.storages.InMemoryStorage()

    def trial_fn(cfg: Config, trial: optuna.Trial) -> object:
        trial.study.set_user_attr(STUDY_CONFIG_HASH, "f" * 64)
        return SyntheticTrial()(cfg, trial)

    with pytest.raises(SearchError, match="another config"):
        run_search(searching(_cfg(tmp_path), trials=1), trial_fn, worker=Worker(storage=storage))
    assert not (tmp_path / "best.yaml").exists()
