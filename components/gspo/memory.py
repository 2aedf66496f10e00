"""Peak memory per training phase: how much the rollout and the updates each need at most.

A results-profile run on 2 CPU cores peaks near a 24 GB machine's limit, and the process's
high-water mark (``ru_maxrss``, what ``/usr/bin/time -v`` prints) cannot say which phase is
responsible. So while a phase runs, a daemon thread samples the resident set size (``VmRSS`` in
``/proc/self/status``) every :data:`SAMPLE_S` seconds and keeps the largest value.

Why sampling, not a reset of the kernel's mark: writing ``5`` to ``/proc/self/clear_refs`` would
give exact per-phase peaks, but it also erases the process-wide mark that ``getrusage`` and
``time -v`` report, which is how this project's README measures a run. A spike shorter than the
sampling interval can be missed; a tensor of gigabytes lives far longer than 10 ms.

CUDA: ``torch.cuda.reset_peak_memory_stats`` / ``max_memory_allocated`` (what the caching
allocator handed to tensors), which is exact and touches nothing else. Values are GiB. Where
``/proc`` is missing (not Linux), host peaks are not reported. With several ranks the trainer logs
the largest rank's peak (every rank logs the same figures).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

GIB = float(1 << 30)
STATUS = "/proc/self/status"
SAMPLE_S = 0.01


def rss_bytes() -> int | None:
    """The process's resident set size (``VmRSS``) in bytes, or None when unreadable."""
    try:
        with open(STATUS) as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


class _RssSampler:
    """Largest ``VmRSS`` seen from :meth:`start` to :meth:`stop` (sampled every ``interval_s``)."""

    def __init__(self, interval_s: float = SAMPLE_S) -> None:
        self.interval_s = interval_s
        self.peak: int | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _sample(self) -> None:
        now = rss_bytes()
        if now is not None and (self.peak is None or now > self.peak):
            self.peak = now

    def _run(self) -> None:
        while not self._done.wait(self.interval_s):
            self._sample()

    def start(self) -> None:
        self._sample()
        self._thread.start()

    def stop(self) -> int | None:
        self._done.set()
        self._thread.join()
        self._sample()
        return self.peak


@dataclass
class PhasePeaks:
    """Peak memory of named phases: :meth:`phase` measures one; :meth:`metrics` names them
    ``perf/rss_<phase>_gb`` (this process, host memory) and ``perf/cuda_<phase>_gb`` (CUDA tensors)."""

    device: torch.device
    peaks: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        sampler = _RssSampler()
        sampler.start()
        try:
            yield
        finally:
            host = sampler.stop()
            if host is not None:
                self.peaks[f"perf/rss_{name}_gb"] = host / GIB
            if cuda:
                self.peaks[f"perf/cuda_{name}_gb"] = torch.cuda.max_memory_allocated(self.device) / GIB

    def metrics(self) -> dict[str, float]:
        return dict(self.peaks)
