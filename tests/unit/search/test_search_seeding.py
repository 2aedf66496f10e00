"""Sampler seeding: concurrent workers and resumed runs sample new points; a lone fresh run is reproducible.

Regression: every process seeded its TPE sampler with ``gspo.seed``, so two workers joining one study
ran the same parameters (trials 0 and 1 identical), and a resumed study repeated its first trials.
"""

from __future__ import annotations

import threading
from pathlib import Path

import optuna
from helpers.params import defaults_params
from helpers.search_helpers import searching

from components.config import Config
from components.search import TrialOutcome, Worker, run_search
from components.search.synthetic import SyntheticTrial

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _cfg(tmp_path: Path, name: str = "best.yaml") -> Config:
    cfg = Config()
    cfg.search = cfg.search.model_copy(update={"out_params": str(tmp_path / name)})
    return cfg


def _params(storage: str | optuna.storages.BaseStorage) -> list[tuple[tuple[str, object], ...]]:
    study = optuna.load_study(study_name="agent-gspo", storage=storage)
    return [tuple(sorted(t.params.items())) for t in sorted(study.trials, key=lambda t: t.number)]


def test_a_resumed_study_samples_new_parameters(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    run_search(searching(_cfg(tmp_path), trials=2), SyntheticTrial(), worker=Worker(storage=url))
    more = run_search(searching(_cfg(tmp_path), trials=4), SyntheticTrial(), worker=Worker(storage=url))
    params = _params(url)
    assert more.trials_this_worker == [2, 3] and len(params) == 4
    assert len(set(params)) == 4  # the resumed run did not repeat trials 0 and 1


def test_concurrent_workers_sample_different_parameters(tmp_path: Path) -> None:
    storage = optuna.storages.InMemoryStorage()
    together = threading.Barrier(2, timeout=60)
    first: set[int] = set()
    lock = threading.Lock()
    results: dict[str, object] = {}

    def trial_fn(cfg: Config, trial: optuna.Trial) -> TrialOutcome:
        me = threading.get_ident()
        with lock:
            is_first = me not in first
            first.add(me)
        if is_first:  # both workers are inside a trial at once: a real concurrent join
            together.wait()
        return SyntheticTrial()(cfg, trial)

    def worker(tag: str) -> None:
        try:
            results[tag] = run_search(searching(_cfg(tmp_path, f"{tag}.yaml"), trials=4), trial_fn,
                                      worker=Worker(storage=storage))
        except BaseException as exc:  # surfaced by the assert below
            results[tag] = exc

    threads = [threading.Thread(target=worker, args=(tag,)) for tag in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    params = _params(storage)
    assert len(params) == 4  # the workers together ran `trials` trials
    assert len(set(params)) == 4, params


def test_a_fresh_run_is_reproducible_from_its_seed(tmp_path: Path) -> None:
    a = run_search(searching(_cfg(tmp_path), trials=3), SyntheticTrial(),
                   worker=Worker(storage=optuna.storages.InMemoryStorage()))
    b = run_search(searching(_cfg(tmp_path), trials=3), SyntheticTrial(),
                   worker=Worker(storage=optuna.storages.InMemoryStorage()))
    assert a.best_overrides == b.best_overrides
    cfg = _cfg(tmp_path)
    cfg.gspo = cfg.gspo.model_copy(update={"seed": cfg.gspo.seed + 1})
    c = run_search(searching(cfg, trials=3), SyntheticTrial(), worker=Worker(storage=optuna.storages.InMemoryStorage()))
    assert c.best_overrides != a.best_overrides


def test_workers_given_one_seed_still_sample_different_parameters(tmp_path: Path) -> None:
    from components.search import worker

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    args = ["--synthetic", "--params", str(defaults_params(tmp_path)), "--storage", url,
            "--out-params", str(tmp_path / "best.yaml"), "--seed", "7"]
    assert worker.main([*args, "--trials", "2"]) == 0
    assert worker.main([*args, "--trials", "4"]) == 0
    params = _params(url)
    assert len(params) == 4 and len(set(params)) == 4
