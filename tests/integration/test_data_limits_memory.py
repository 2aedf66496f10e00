"""A 50 MB question in a prepared file is refused by ``evaluate`` and ``validate`` with exit 2 and a
small peak RSS: the size check comes before any item is built or tokenised (before this check,
evaluate tokenised 21.6 M tokens, reached 15.5 GB and was killed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT
from helpers.prepared import write_prepared

from components.data.prepare import load_split, records_to_table

pytestmark = [pytest.mark.slow]  # the session fixture prepares every benchmark first
ROOT = REPO_ROOT
PEAK_LIMIT_KB = 2 * 1024 * 1024  # 2 GiB
RUN = ("import sys\nfrom components.cli import main\nrc = main(sys.argv[1:])\n"
       "hwm = next(ln for ln in open('/proc/self/status') if ln.startswith('VmHWM:')).split()[1]\n"
       "print('peak_rss_kb', hwm, file=sys.stderr)\nsys.exit(rc)\n")
"""The child's own peak: ``VmHWM`` of its address space, not ``getrusage``'s ``ru_maxrss``, which Linux
carries over ``exec`` from the process that forked it (a pytest worker holding SmolLM2 read 4.2 GB
there once, on two xdist workers, for a child that never held 1 GB)."""


def _cli(*args: str) -> tuple[int, str, int]:
    """Exit code, stderr and peak RSS (kB) of ``agent-gspo <args>`` in a child process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-c", RUN, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    peak = int(res.stderr.rsplit("peak_rss_kb", 1)[1].split()[0])
    return res.returncode, res.stderr, peak


def test_a_50_mb_question_is_refused_with_a_small_peak_rss(prepared_data: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(prepared_data / "gsm8k", data / "gsm8k")
    shutil.copy(prepared_data / "manifest.json", data / "manifest.json")
    rows = [it.to_record() for it in load_split(data, "gsm8k", "test")]
    rows[3]["question"] = "7 " * 25_000_000
    path = write_prepared(data, "gsm8k", "test", records_to_table(rows))  # recorded: as if prepared
    rc, err, peak = _cli("evaluate", "--no-track", "--limit", "2", "--baselines", "", "--out", str(tmp_path / "e"),
                         "--set", f"data.out_dir={data}", "--set", "eval.benchmarks=[gsm8k]")
    assert rc == 2 and f"{path}: row 3 (id gsm8k/test/3): 'question' has 50000000 characters" in err, err
    assert "Traceback" not in err and peak < PEAK_LIMIT_KB, peak
    rc, err, peak_validate = _cli("validate", "--data", str(data), "--set", f"data.report_dir={tmp_path / 'r'}",
                                  "--set", "data.benchmarks=[gsm8k]")
    assert rc == 2 and "data validation failed for gsm8k/test" in err and "max_question_chars" in err, err
    assert peak_validate < PEAK_LIMIT_KB, peak_validate
    print(f"peak RSS: evaluate {peak / 1024:.0f} MiB, validate {peak_validate / 1024:.0f} MiB")
