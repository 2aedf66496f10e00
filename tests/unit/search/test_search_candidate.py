"""A search's best trial reaches the pipeline only as a candidate that beats the profile beyond noise;
the sqlite study survives a copy of its ``.db`` file alone (normal end, error, Ctrl-C)."""

from __future__ import annotations

import shutil
from pathlib import Path

import optuna
import pytest
from helpers.search_helpers import searching
from optuna.trial import TrialState

from components.comparison import ItemScore
from components.config import Config
from components.search import TrialOutcome, Worker, load_best_params, run_search
from components.search.candidate import STUDY_BASELINE, BaselineTrial, comparison_rule
from components.search.synthetic import SyntheticTrial

optuna.logging.set_verbosity(optuna.logging.WARNING)
OLD = "# the nightly pipeline's current parameters\nparams:\n  mas: {agents: 3}\n"


def _cfg(tmp_path: Path, **rule: object) -> Config:
    cfg = Config()
    cfg.search = cfg.search.model_copy(update={"out_params": str(tmp_path / "best.yaml")})
    cfg.registry = cfg.registry.model_copy(update={"gate": cfg.registry.gate.model_copy(update=rule)})
    return cfg


def _outcome(correct: list[bool], tokens: float = 100.0) -> TrialOutcome:
    """Fabricated per-item results on two dev benchmarks (the first half of ``correct`` on each)."""
    half = len(correct) // 2
    items = {b: [ItemScore(f"{b}-{i}", c, tokens) for i, c in enumerate(part)]
             for b, part in (("aqua", correct[:half]), ("mmlu", correct[half:]))}
    return TrialOutcome(dev_accuracy=sum(correct) / len(correct), mean_tokens_per_episode=tokens,
                        tokens_spent=int(tokens * len(correct)), seconds=0.0, items=items)


def test_a_tied_search_writes_nothing_and_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The bug: two trials tied at dev accuracy 0.000 and the one with fewer tokens was written as best."""
    cfg = _cfg(tmp_path)
    Path(cfg.search.out_params).write_text(OLD)
    seen: list[object] = []

    def tied(trial_cfg: Config, trial: object) -> TrialOutcome:
        seen.append(trial.number)
        return _outcome([False] * 50)  # every trial and the baseline: identical results

    result = run_search(searching(cfg, trials=2), tied, worker=Worker(storage=optuna.storages.InMemoryStorage()))
    assert seen == [0, 1, "baseline"]
    assert Path(cfg.search.out_params).read_text() == OLD  # left exactly as it was
    assert not result.written
    assert result.verdict.startswith(f"trial {result.best_trial} vs the profile's parameters: tie")
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("search: nothing changes")]
    assert len(lines) == 1 and "left as it was" in lines[0] and "no difference beyond noise" in lines[0]


def test_a_real_improvement_writes_the_candidate(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    Path(cfg.search.out_params).write_text(OLD)
    baseline = [i % 4 == 0 for i in range(52)]  # 25 %
    improved = [c or i % 4 == 1 for i, c in enumerate(baseline)]  # 50 %, every baseline hit kept

    def objective(trial_cfg: Config, trial: object) -> TrialOutcome:
        return _outcome(baseline if isinstance(trial, BaselineTrial) else improved)

    storage = optuna.storages.InMemoryStorage()
    result = run_search(searching(cfg, trials=2), objective, worker=Worker(storage=storage))
    assert result.written and "better: more accurate beyond noise" in result.verdict
    assert sorted(load_best_params(cfg.search.out_params)) == sorted(result.best_overrides)
    assert "verdict: 'trial" in Path(cfg.search.out_params).read_text()
    study = optuna.load_study(study_name="agent-gspo", storage=storage)
    assert study.user_attrs[STUDY_BASELINE]["dev_accuracy"] == pytest.approx(0.25)


def test_too_few_dev_items_decide_nothing(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, min_items=40)

    def objective(trial_cfg: Config, trial: object) -> TrialOutcome:
        return _outcome([False] * 10 if isinstance(trial, BaselineTrial) else [True] * 10)

    result = run_search(searching(cfg, trials=1), objective, worker=Worker(storage=optuna.storages.InMemoryStorage()))
    assert not result.written and "too few items: 10 < min_items 40" in result.verdict
    assert not Path(cfg.search.out_params).exists()


def test_a_trial_function_without_items_never_writes(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)

    def bare(trial_cfg: Config, trial: object) -> TrialOutcome:
        return TrialOutcome(dev_accuracy=0.9, mean_tokens_per_episode=10.0, tokens_spent=1, seconds=0.0)

    result = run_search(searching(cfg, trials=1), bare, worker=Worker(storage=optuna.storages.InMemoryStorage()))
    assert not result.written and "could not be evaluated" in result.verdict
    assert not Path(cfg.search.out_params).exists()


def test_the_search_judges_with_the_promotion_gates_rule(tmp_path: Path) -> None:
    cfg = Config()
    assert comparison_rule(cfg) == cfg.registry.gate.rule()
    assert cfg.search.dev_items * 2 == cfg.registry.gate.min_items  # two dev benchmarks can decide at all
    changed = _cfg(tmp_path, confidence=0.9, margin=0.01, token_factor=0.8, max_token_ratio=1.2, min_items=100)
    rule = comparison_rule(changed)
    assert (rule.confidence, rule.margin, rule.token_factor, rule.max_token_ratio, rule.min_items) == (
        0.9, 0.01, 0.8, 1.2, 100)


class _Interrupt:
    """Synthetic trials; the third one is ended by Ctrl-C."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, cfg: Config, trial: optuna.Trial) -> TrialOutcome:
        self.calls += 1
        if self.calls == 3:
            raise KeyboardInterrupt
        return SyntheticTrial()(cfg, trial)


@pytest.mark.parametrize("ending", ["normal", "ctrl-c"])
def test_a_copy_of_the_db_file_alone_holds_every_trial(tmp_path: Path, ending: str) -> None:
    """The study was left in WAL mode and never checkpointed: a copy of optuna.db alone loaded as
    "Record does not exist"."""
    db = tmp_path / "optuna.db"
    cfg = _cfg(tmp_path)
    url = f"sqlite:///{db}"
    if ending == "normal":
        run_search(searching(cfg, trials=3), SyntheticTrial(), worker=Worker(storage=url))
    else:
        with pytest.raises(KeyboardInterrupt):
            run_search(searching(cfg, trials=3), _Interrupt(), worker=Worker(storage=url))
    copy = tmp_path / "elsewhere" / "optuna.db"
    copy.parent.mkdir()
    shutil.copy(db, copy)  # the .db file only, no -wal / -shm
    study = optuna.load_study(study_name="agent-gspo", storage=f"sqlite:///{copy}")
    states = [t.state for t in study.get_trials()]
    if ending == "normal":
        assert states == [TrialState.COMPLETE] * 3 and STUDY_BASELINE in study.user_attrs
    else:
        assert states == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.FAIL]
        assert study.get_trials()[2].user_attrs["search:interrupted"] == "SIGINT"
    assert not Path(f"{db}-wal").exists() or Path(f"{db}-wal").stat().st_size == 0
