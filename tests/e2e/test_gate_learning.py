"""The promotion gate on real evidence: a really trained policy beats its untrained twin on the
tiny learning task (tests/helpers/learning_env.py), and the untrained twin does not beat it back.

The gate's own tests (tests/unit/tracking/test_tracking_promotion.py) fabricate per-item records; here the
records come from rollouts of the tiny policy before and after GSPO training on the silence task
(agent 1's messages never help, λ_tok = 0.5: agent 1 learns to stay silent, the helper keeps
talking). Both policies play the same held-out items with the same sampling seed through the same
environment and judge; :func:`components.evaluation.items.records_of` turns the episodes into the
per-item record an evaluation writes, and ``gate_helpers`` logs it as the evaluation of a version
in a fresh sqlite registry. Choices, each forced by the task:

* Held-out items: the judge reads only who spoke, so every question of the template is an item of
  the task; 400 items the policy never trained on (``toy/16`` ...) leave the project's
  ``min_items`` (50) as it is and shrink the paired standard error of accuracy to ~0.01.
* Sampled play (``mas.temperature`` 1.0, fixed seed), not greedy: the marker prior makes the
  silence token the untrained policy's argmax (4 % beats each of ~500 other tokens), so greedily
  the untrained team is always silent (accuracy 0) and a greedy "better" would measure that
  quirk, not the training.
* ``registry.gate.token_factor`` 1.0 ("fewer tokens beyond noise"), the rest of ``registry.gate``
  as in params.yaml: the prompts (~453 of ~474 tokens an untrained episode spends) are fixed by
  the task, so no policy can save the default 10 % of total tokens; silencing agent 1 and
  shortening the helper's message saves ~19 (4 %).

Seen on 2 CPU cores (Xeon, 2026-12-06), this test (400 items, 40 steps, ~50 s): untrained
accuracy 0.973, 475.9 tokens/episode (agent 1 silent 0.04, helper 0.03); trained 0.988, 456.2
(agent 1 silent 0.82, helper 0.01): ``cheaper`` (accuracy difference +0.015, lower bound -0.0015;
tokens 0.959x, -19.6 per item beyond noise), and the untrained twin against it: ``tie``
(challenger). Exploring seed 2 on 200 held-out items (outcome against the untrained policy, token
factor 1.0): step 25 worse (silence first leaks to the helper), 30-45 better, 50 tie (accuracy
0.96 vs 0.955), 55 better; seed 4 learns later (better or cheaper from step 50). 40 steps sit in
the middle of seed 2's window. The policy's gibberish texts once held U+2028, which the items
reader split a line at (fixed in :func:`components.evaluation.items.decode`).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest
from helpers import gate_helpers as gh
from helpers.learning_env import ITEMS, make_run
from helpers.paths import load_test_module
from mlflow import MlflowClient

from components.config import load_config
from components.data.item import Item
from components.evaluation.items import records_of
from components.evaluation.runner import MAIN_SYSTEM
from components.tracking import GateRule, GateSpec, promote

test_tracking_helpers = load_test_module("test_tracking_helpers")

mlflow_uri = test_tracking_helpers.mlflow_uri  # fixture: a fresh sqlite registry in tmp_path
pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.usefixtures("one_thread")]

SEED, STEPS, PLAY_SEED, N_ITEMS = 2, 40, 1234, 400
BENCH = "gsm8k"  # what the task's items say they are
HELD_OUT = [Item(id=f"toy/{i}", benchmark=BENCH, split="test", question=f"What is {i} plus {i}?", answer=str(2 * i),
                 answer_type="numeric") for i in range(len(ITEMS), len(ITEMS) + N_ITEMS)]
NAME = "tiny-silence"


def _play(run) -> list[dict]:
    """One sampled episode per held-out item, as the per-item record an evaluation writes."""
    episodes = run.task.play(HELD_OUT, 1, seed=PLAY_SEED)
    return records_of({MAIN_SYSTEM: {BENCH: episodes}}, {BENCH: HELD_OUT})


def _silent(rows: list[dict], agent: int) -> float:
    return statistics.mean(float(silent) for r in rows for a, _, silent in r["silence"] if a == agent)


def _summary(rows: list[dict]) -> str:
    return (f"accuracy {statistics.mean(r['correct'] for r in rows):.3f}, tokens/episode "
            f"{statistics.mean(r['tokens']['total'] for r in rows):.1f} (completion "
            f"{statistics.mean(r['tokens']['completion'] for r in rows):.1f}), agent 1 silent "
            f"{_silent(rows, 1):.2f}, helper silent {_silent(rows, 0):.2f}")


def _alias(client: MlflowClient, alias: str) -> str | None:
    aliases = client.get_registered_model(NAME).aliases
    return str(aliases[alias]) if alias in aliases else None


def test_trained_policy_is_promoted_and_its_untrained_twin_is_not(mlflow_uri: str, tmp_path: Path) -> None:
    start = time.monotonic()
    run = make_run(["reward.lambda_tok=0.5", "budget.enabled=false"], task="helper", helper_agent=0, seed=SEED)
    untrained = _play(run)
    for _ in range(STEPS):
        run.trainer.train_step()
    trained = _play(run)
    print(f"\nuntrained: {_summary(untrained)}\ntrained ({STEPS} steps, seed {SEED}): {_summary(trained)}")
    assert _silent(trained, 1) > 0.5, f"training did not silence agent 1: {_summary(trained)}"

    reg = load_config(overrides=["registry.gate.token_factor=1.0"]).registry
    rule = GateRule(reg.gate.rule(), reg.min_accuracy, reg.gate.test)  # as components/jobs/promote.py builds it
    client = MlflowClient(mlflow_uri)

    def version(rows: list[dict]) -> str:
        v = gh.register(client, tmp_path, NAME)
        gh.evaluate(client, tmp_path, NAME, v, rows)
        return v

    def gate(v: str):
        d = promote(client, NAME, v, gate=GateSpec(gh.KEY, rule, trust=gh.trust(client)))
        print(d.block())
        return d

    first = version(untrained)
    assert gate(first).decision == "champion" and _alias(client, "champion") == first

    cand = version(trained)
    d = gate(cand)
    assert d.verdict is not None and d.verdict.outcome in {"better", "cheaper"}, d.reason
    assert d.decision == "champion" and d.compared_to == first and _alias(client, "champion") == cand

    twin = version(untrained)  # the untrained weights' evaluation once more, as a new version
    d = gate(twin)
    assert d.verdict is not None and d.verdict.outcome in {"tie", "worse"}, d.reason
    assert d.decision == "challenger" and d.compared_to == cand
    assert _alias(client, "champion") == cand and _alias(client, "challenger") == twin
    print(f"wall time {time.monotonic() - start:.1f} s")
