"""bench/eval_speed.py runs end to end (tiny model, two benchmarks) and prints the settings of both
sides, the paired accuracy line and the one bench line; the paired comparison is unit-checked."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT

ROOT = REPO_ROOT

from bench.eval_speed import accuracy_line  # noqa: E402
from components.evaluation.runner import EvalReport, ItemOutcome  # noqa: E402


def _report(correct: dict[str, list[bool]]) -> EvalReport:
    per = {b: [ItemOutcome(f"{b}{i}", c, 10, 5) for i, c in enumerate(cs)] for b, cs in correct.items()}
    return EvalReport([], "", {}, {}, {}, None, {}, {"agent_gspo": per})  # type: ignore[arg-type]


def test_accuracy_line_is_paired_and_says_whether_within_one_se():
    same = _report({"gsm8k": [True, False, True, False]})
    assert "difference +0.000 ± 0.000 (paired SE): within one SE; 0 item(s)" in accuracy_line(same, same)
    worse = _report({"gsm8k": [False, False, True, False]})
    line = accuracy_line(worse, same)
    assert "ours 0.250, peer 0.500 on 4 paired items; difference -0.250 ± 0.250" in line and "1 item(s)" in line
    assert "within one SE" in line  # one flip out of 4: |−0.25| <= SE 0.25
    other = _report({"mmlu": [True] * 4})
    assert "different items" in accuracy_line(other, same)


@pytest.mark.slow
def test_bench_runs_end_to_end_on_the_tiny_model(prepared_data: Path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "bench/eval_speed.py", "--model", "tiny-random", "--items", "1",
                          "--repeats", "1", "--benchmarks", "gsm8k,aqua", "--data", str(prepared_data)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = res.stdout
    assert "(dtype bfloat16); peer: model.dtype=float32 (dtype float32)" in out
    assert re.search(r"^accuracy: ours [0-9.]+, peer [0-9.]+ on 2 paired items", out, re.M), out
    assert re.search(r"^bench eval_speed: ours [0-9.]+ items/s, peer [0-9.]+ items/s, ratio [0-9.]+x \(target 2x\)$",
                     out, re.M), out
