"""Ctrl-C / SIGTERM during a search: one line, and the interrupted trial does not use up a trial.

Regression: Optuna logged ``Trial 0 failed ... KeyboardInterrupt()`` with a 40-line traceback before
the project's one line, and the interrupted (FAIL) trial counted toward ``--trials``, so a rerun
with ``--trials 2`` ran a single trial.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from helpers.params import defaults_params
from helpers.paths import REPO_ROOT
from helpers.search_helpers import searching
from optuna.trial import TrialState

from components.config import Config
from components.errors import Terminated
from components.search import TrialOutcome, Worker, run_search
from components.search import budget as B
from components.search.synthetic import SyntheticTrial

ROOT = REPO_ROOT


def _cfg(tmp_path: Path) -> Config:
    cfg = Config()
    cfg.search = cfg.search.model_copy(update={"out_params": str(tmp_path / "best.yaml")})
    return cfg


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def optuna_log() -> Iterator[_Records]:
    """Everything Optuna logs (its library logger does not propagate to the root logger)."""
    handler = _Records()
    logger = logging.getLogger("optuna")
    logger.addHandler(handler)
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        optuna.logging.set_verbosity(level)


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, Terminated])
def test_an_interrupted_trial_is_quiet_and_does_not_count(
        tmp_path: Path, optuna_log: _Records, capsys: pytest.CaptureFixture[str],
        interrupt: type[KeyboardInterrupt]) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"

    def stopped(cfg: Config, trial: optuna.Trial) -> TrialOutcome:
        raise interrupt()

    with pytest.raises(interrupt):
        run_search(searching(_cfg(tmp_path), trials=2), stopped, worker=Worker(storage=url))
    assert not [m for m in optuna_log.messages if "failed" in m], optuna_log.messages
    err = capsys.readouterr().err  # progress lines may be there (a CLI logger); Optuna's report may not
    assert "Traceback" not in err and "failed" not in err and "KeyboardInterrupt" not in err, err
    study = optuna.load_study(study_name="agent-gspo", storage=url)
    (trial,) = study.trials
    assert trial.state == TrialState.FAIL and trial.user_attrs[B.ATTR_INTERRUPTED] == (
        "SIGTERM" if interrupt is Terminated else "SIGINT")

    again = run_search(searching(_cfg(tmp_path), trials=2), SyntheticTrial(), worker=Worker(storage=url))
    assert again.n_complete == 2 and again.trials_this_worker == [1, 2]
    assert again.n_failed == 0 and again.n_interrupted == 1 and again.stopped_by == "trials"


def _worker(tmp_path: Path, url: str, sleep: float) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "components.search.worker", "--synthetic", "--sleep", str(sleep),
           "--params", str(defaults_params(tmp_path)), "--storage", url, "--trials", "2",
           "--out-params", str(tmp_path / "best.yaml")]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for_a_running_trial(url: str, proc: subprocess.Popen[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            study = optuna.load_study(study_name="agent-gspo", storage=url)
            if any(t.state == TrialState.RUNNING and t.user_attrs.get(B.ATTR_ADMITTED) for t in study.trials):
                return
        except KeyError:  # the worker has not created the study yet
            pass
        time.sleep(0.2)
    raise AssertionError("the worker never started a trial")


@pytest.mark.parametrize(("sig", "code", "name"), [(signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM")])
def test_a_signalled_worker_prints_one_line_and_its_trial_is_not_counted(
        tmp_path: Path, sig: signal.Signals, code: int, name: str) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    proc = _worker(tmp_path, url, sleep=60.0)
    try:
        _wait_for_a_running_trial(url, proc)
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code
    lines = [line for line in err.splitlines() if not line.startswith("[I ")]  # Optuna's own INFO lines
    assert lines == [f"agent-gspo search worker: interrupted ({name})"], err
    again = run_search(searching(_cfg(tmp_path), trials=2), SyntheticTrial(), worker=Worker(storage=url))
    assert again.n_complete == 2 and len(again.trials_this_worker) == 2


def test_each_trial_is_reported_once(tmp_path: Path, optuna_log: _Records, caplog) -> None:
    """The project's "trial i/n done" line, not Optuna's "Trial N finished with value ..." echo of it
    too (Optuna's verbosity is given back as it was)."""
    caplog.set_level(logging.INFO, logger="components")
    run_search(searching(_cfg(tmp_path), trials=2), SyntheticTrial(),
               worker=Worker(storage=optuna.storages.InMemoryStorage()))
    assert optuna.logging.get_verbosity() == optuna.logging.INFO
    assert not [m for m in optuna_log.messages if "finished with value" in m], optuna_log.messages
    done = [m.split(" done")[0] for m in caplog.messages if m.startswith("trial ") and " done in " in m]
    assert done == ["trial 1/2", "trial 2/2"]
