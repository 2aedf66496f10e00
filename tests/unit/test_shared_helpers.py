"""One helper per former repeat: the file lock (prepare, one training per folder, one promotion),
the finite-number check, the token-measure dispatch, ``budget_fraction`` -> ``budget.fraction``
and the paper's clip range. Each test pins the behaviour the copies had."""

from __future__ import annotations

import inspect
from pathlib import Path

import filelock
import pytest
from helpers.paths import load_test_module

from components.config import load_config
from components.config_sections import EPS_HIGH, EPS_LOW, GspoConfig
from components.errors import UserError
from components.gspo.loss import gspo_loss
from components.io import file_lock
from components.jobs.metrics import write_metrics
from components.mas.records import TOKEN_MEASURES, measured_tokens
from components.numbers import is_finite_number
from components.reward.reward import RewardError, message_tokens
from components.runtime.run_folder import exclusive
from components.tracking.errors import PromotionError
from components.tracking.registry import _promotion_running
from experiments.definitions import Experiment, budget_overrides, experiment_config

episode = load_test_module("test_reward").episode
msg = load_test_module("test_reward").msg


def held(path: Path) -> filelock.FileLock:
    """Another holder of ``path`` (a second ``flock`` on its own descriptor, as another process)."""
    other = filelock.FileLock(str(path), thread_local=False)
    other.acquire(timeout=0)
    return other


def test_file_lock_names_the_file_when_it_stays_held(tmp_path):
    other = held(tmp_path / "x.lock")
    try:
        with pytest.raises(UserError, match=r"x\.lock: still locked by another process after 0 s"):
            with file_lock(tmp_path / "x.lock", timeout_s=0):
                pass
        with pytest.raises(PromotionError, match=r"promotion lock .*x\.lock still held after 0 s"):
            with file_lock(tmp_path / "x.lock", timeout_s=0, busy=_promotion_running):
                pass
    finally:
        other.release()
    with file_lock(tmp_path / "sub" / "x.lock", timeout_s=0):  # free: taken at once, the folder made
        assert (tmp_path / "sub" / "x.lock").exists()


def test_one_training_per_folder_goes_through_the_same_lock(tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    (tmp_path / "run").mkdir()
    other = held(tmp_path / "run" / ".train.lock")
    try:
        with pytest.raises(UserError, match=r"run: another training is running in this folder \(it holds .*"
                                            r"\.train\.lock\); wait for it to finish, or choose another --out"):
            with exclusive(tmp_path / "run"):
                pass
    finally:
        other.release()
    with exclusive(tmp_path / "run"):
        pass


@pytest.mark.parametrize("value, ok", [(1, True), (0.5, True), (-2.0, True), (True, False), (False, False),
                                       (float("nan"), False), (float("inf"), False), ("1", False), (None, False)])
def test_is_finite_number(value, ok):
    assert is_finite_number(value) is ok


def test_metrics_refuse_what_is_not_a_finite_number(tmp_path):
    with pytest.raises(ValueError, match=r"metrics m\.json\.train\.x: True is not a finite number"):
        write_metrics(tmp_path / "m.json", {"train": {"x": True}})
    assert write_metrics(tmp_path / "m.json", {"train": {"x": 1.5}}).exists()


def test_one_token_measure_dispatch_for_messages_and_episodes():
    messages = [msg(0, 0, [1, 2, 3]), msg(1, 0, [4], silent=True), msg(2, 1, [5, 6], recipients=[0])]
    ep = episode(messages)
    for measure in TOKEN_MEASURES:
        assert sum(message_tokens(m, measure) for m in messages) == ep.tokens(measure) == measured_tokens(ep, measure)
    assert [measured_tokens(messages[0], m) for m in TOKEN_MEASURES] == [3, 6, 13]
    assert measured_tokens(ep, "prompt") is None
    with pytest.raises(ValueError, match=r"unknown token measure 'x' \(allowed: completion, communicated, total\)"):
        ep.tokens("x")
    with pytest.raises(RewardError, match=r"reward\.token_measure: unknown 'x' \(allowed: completion, communicated"):
        message_tokens(messages[0], "x")


def _experiment(fraction: float | None) -> Experiment:
    return Experiment(name="e", kind="gspo", label="e", description="", extends=None, overrides=(),
                      budget_fraction=fraction)


def test_budget_fraction_becomes_budget_fraction_in_one_place():
    assert budget_overrides(_experiment(None)) == []
    assert budget_overrides(_experiment(0.35)) == ["budget.fraction=0.35"]
    base = load_config(None, "smoke", [])
    assert experiment_config(base, _experiment(0.35)).budget.fraction == 0.35
    assert experiment_config(base, _experiment(None)).budget.fraction == base.budget.fraction


def test_the_paper_clip_range_is_one_constant():
    assert (EPS_LOW, EPS_HIGH) == (3e-4, 4e-4)
    assert (GspoConfig().eps_low, GspoConfig().eps_high) == (EPS_LOW, EPS_HIGH)
    default = inspect.signature(gspo_loss).parameters["settings"].default
    assert (default.eps_low, default.eps_high) == (EPS_LOW, EPS_HIGH)
