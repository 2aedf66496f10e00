"""Two worker processes share one sqlite study: trial target and token budget hold across them.

This is the multi-host pattern on one host: every worker runs
``python -m components.search.worker --synthetic --storage URL --study-name NAME``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from helpers.params import defaults_params
from helpers.paths import REPO_ROOT
from optuna.trial import TrialState

from components.config import Config
from components.search import budget as B
from components.search.study import select_best
from components.search.synthetic import synthetic_outcome

pytestmark = pytest.mark.integration
REPO = REPO_ROOT


def _run_workers(tmp_path: Path, *extra: str, n: int = 2) -> tuple[list[dict], list[optuna.trial.FrozenTrial]]:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "components.search.worker", "--synthetic", "--storage", url,
         "--study-name", "shared", "--params", str(defaults_params(tmp_path)),
         "--out-params", str(tmp_path / f"best-{i}.yaml"), *extra],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(n)]
    deadline = time.monotonic() + 50
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    trials = optuna.load_study(study_name="shared", storage=url).trials
    return results, trials


def _overlap(a: optuna.trial.FrozenTrial, b: optuna.trial.FrozenTrial) -> bool:
    return a.datetime_start < b.datetime_complete and b.datetime_start < a.datetime_complete


def test_two_workers_share_the_trial_target(tmp_path: Path) -> None:
    results, trials = _run_workers(tmp_path, "--trials", "10", "--sleep", "0.4")
    mine = [set(r["trials_this_worker"]) for r in results]
    assert all(mine) and not (mine[0] & mine[1])  # both worked, never on the same trial
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(mine[0] | mine[1]) == len(complete) == 10
    assert all(B.is_refused(t) for t in trials if t.state != TrialState.COMPLETE)
    by_worker = [[t for t in complete if t.number in m] for m in mine]
    assert any(_overlap(a, b) for a in by_worker[0] for b in by_worker[1])  # really concurrent
    # A worker that stopped while the other still ran its last trial saw fewer than 10 and may name an
    # earlier best; the one that finished last saw all 10, and every worker that saw all 10 names the
    # study's best.
    whole = [r for r in results if r["n_complete"] == 10]
    assert whole, [r["n_complete"] for r in results]
    assert {r["best_trial"] for r in whole} == {select_best(trials).number}


def test_two_workers_share_the_token_budget(tmp_path: Path) -> None:
    biggest = Config().model_copy(deep=True)
    biggest.mas.agents, biggest.mas.rounds, biggest.mas.topology = 5, 3, "debate"
    biggest.reward.lambda_tok, biggest.budget.target, biggest.gspo.group_size = 1e-3, 800.0, 16
    reserve = synthetic_outcome(biggest).tokens_spent  # an upper bound on one synthetic trial
    budget = 2_500_000
    results, trials = _run_workers(tmp_path, "--trials", "200", "--sleep", "0.3", "--budget-tokens",
                                   str(budget), "--reserve-tokens", str(reserve))
    admitted = sorted((t for t in trials if not B.is_refused(t)), key=lambda t: t.number)
    spent = [t.user_attrs[B.ATTR_TOKENS] for t in admitted]
    assert all(t.state == TrialState.COMPLETE for t in admitted) and len(admitted) < 200
    assert {r["stopped_by"] for r in results} == {"budget_tokens"}
    assert max(spent) <= reserve
    assert sum(spent) <= budget + spent[-1]  # overspent by at most the last admitted trial
    assert all(r["trials_this_worker"] for r in results)
