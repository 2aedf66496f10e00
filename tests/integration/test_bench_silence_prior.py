"""bench/silence_prior.py runs end to end on the tiny model with prepared data and ends with the
one bench line; a source without enough items left after calibration is refused by name."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT

ROOT = REPO_ROOT
pytestmark = pytest.mark.slow


def _run(prepared_data: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "bench/silence_prior.py", "--model", "tiny-random", "--threads", "1",
                           "--data", str(prepared_data), *extra], cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=600)


def test_bench_runs_end_to_end_on_the_tiny_model(prepared_data: Path):
    res = _run(prepared_data, "--items", "3", "--sources", "gsm8k/train,svamp/test")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert re.search(r"^per_prompt: calibration prompts [0-9.]+; held out \(9 prompts\) mean", res.stderr, re.M)
    assert re.search(r"^mean_direction: calibration prompts", res.stderr, re.M)
    assert re.search(r"^bench silence_prior: ours [0-9.]+ share, peer [0-9.]+ share, ratio [0-9.]+x \(target 1.5x\)$",
                     res.stdout, re.M), res.stdout


def test_too_few_items_is_refused_with_the_numbers(prepared_data: Path):
    res = _run(prepared_data, "--items", "100000")
    assert res.returncode != 0 and "need --items 100000" in res.stderr
