"""Peak memory per training phase (components/gspo/memory.py): a phase that holds a large tensor
reports its peak, a phase that does not reports less, and the process-wide mark is left alone."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest
import torch
from helpers.paths import REPO_ROOT

from components.gspo.memory import PhasePeaks

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs Linux /proc")


_PHASES = """
import json, time, torch
from components.gspo.memory import GIB, PhasePeaks, rss_bytes
peaks = PhasePeaks(torch.device("cpu"))
base = rss_bytes()
with peaks.phase("big"):
    x = torch.ones(96 * 2**20)  # 384 MiB, touched (ones), so resident
    time.sleep(0.3)  # 30 sampling intervals: room for a busy scheduler
    del x
with peaks.phase("small"):
    time.sleep(0.05)
print(json.dumps({"base_gb": base / GIB, **peaks.metrics()}))
"""


def test_a_phase_reports_the_peak_of_what_it_held() -> None:
    """Measured in a fresh interpreter: inside a long test session other threads (servers, loggers
    of earlier tests) free and take memory at the same time, so the process's RSS need not grow by
    what this phase holds (CI once saw 1.77 GB before and at the peak)."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _PHASES], check=True, capture_output=True,
                         text=True, timeout=120, cwd=REPO_ROOT).stdout
    m = json.loads(out.strip().splitlines()[-1])
    base = m.pop("base_gb")
    assert m["perf/rss_big_gb"] >= base + 0.3
    assert m["perf/rss_small_gb"] < m["perf/rss_big_gb"] - 0.3
    assert set(m) == {"perf/rss_big_gb", "perf/rss_small_gb"}  # no CUDA keys on a CPU device


def test_measuring_does_not_reset_the_process_peak() -> None:
    """``time -v`` / getrusage report the process's peak: phases must not erase it."""
    y = torch.ones(64 * 2**20)  # 256 MiB
    del y
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peaks = PhasePeaks(torch.device("cpu"))
    with peaks.phase("idle"):
        pass
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >= before


def test_a_failing_phase_still_records_and_stops_its_sampler() -> None:
    import threading

    peaks = PhasePeaks(torch.device("cpu"))
    with pytest.raises(RuntimeError), peaks.phase("boom"):
        raise RuntimeError("x")
    assert "perf/rss_boom_gb" in peaks.metrics()
    assert not any(t.name == "rss-sampler" for t in threading.enumerate())


def test_the_step_line_shows_both_phase_peaks_when_measured() -> None:
    from components.runtime.training_run import _progress_line

    line = _progress_line(3, 30, {"perf/rss_rollout_gb": 2.31, "perf/rss_update_gb": 9.87,
                                  "perf/cuda_rollout_gb": 1.04, "perf/cuda_update_gb": 20.5})
    assert line.startswith("step 3/30") and line.endswith("rss 2.3/9.9 GB  cuda 1.0/20.5 GB")
    assert "GB" not in _progress_line(3, 30, {})  # not measured: nothing printed
