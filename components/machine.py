"""What a measurement ran on: the facts that decide whether another machine reproduces it.

Greedy bf16 decoding is deterministic on one machine and build, not across machines: the matmul
kernels torch picks depend on the CPU's instruction sets (AVX-512 BF16, AMX) and on the thread
count, and a different rounding at one position changes every later token of that message.
Measured 2026-12-04: the same converted SmolLM2 weights (byte-equal) gave the untrained MAS 0.51
held-out accuracy on ``splitinfo`` on one 2-core machine (a Xeon with AMX) and 0.57 on the 2-core
machine used until 2026-12-03. Evaluation summaries and results files therefore record
this fingerprint next to the git commit and config hash, so that a reader can tell "another
machine" from "another result". Timings (wall seconds) depend on the same facts.

No library records this in a form we can store in a results file (``torch.utils.collect_env``
shells out to tools for minutes-long text meant for bug reports); this is a few reads.
"""

from __future__ import annotations

import os
import platform
from functools import lru_cache
from pathlib import Path
from typing import Any

BF16_FLAGS = ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx2", "fma")
"""CPU flags that change which bf16 / fp32 kernels oneDNN and torch use on x86 (``/proc/cpuinfo``)"""


def _cpuinfo(path: Path = Path("/proc/cpuinfo")) -> tuple[str | None, list[str]]:
    """(model name, the BF16_FLAGS present) from the first processor block; (None, []) if unreadable."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None, []
    name, flags = None, set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and name is None:
            name = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
        if not line.strip() and name is not None:
            break
    return name, [f for f in BF16_FLAGS if f in flags]


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # noqa: BLE001 - not installed (or broken metadata): recorded as unknown
        return None


@lru_cache(maxsize=1)
def _static_facts() -> dict[str, Any]:
    """What cannot change within a process (read once)."""
    import torch

    cpu, flags = _cpuinfo()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu or platform.processor() or None, "cpu_flags": flags, "gpu": gpu, "system": platform.system(),
            "python": platform.python_version(), "torch": torch.__version__, "transformers": _version("transformers")}


def machine_fingerprint() -> dict[str, Any]:
    """JSON-ready facts: cpu model, its bf16-relevant flags, usable cores, torch threads (read now: a
    process may change them), GPU name (None on CPU), and the versions of python, torch and transformers."""
    import torch

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 0
    facts = dict(_static_facts())
    facts.update(cores=cores, torch_threads=torch.get_num_threads())
    return facts


def describe(fingerprint: dict[str, Any] | None) -> str:
    """One line for reports, e.g. ``Intel(R) Xeon(R) Processor, 2 cores (avx512_bf16, amx_bf16), torch
    2.13.0+cpu x 2 threads``; ``not recorded`` for files written before fingerprints existed."""
    if not fingerprint:
        return "not recorded"
    f = fingerprint
    flags = [x for x in f.get("cpu_flags") or [] if x in ("avx512_bf16", "amx_bf16")]
    where = f.get("gpu") or f"{f.get('cpu') or 'unknown CPU'}, {f.get('cores')} cores"
    isa = f" ({', '.join(flags)})" if flags and not f.get("gpu") else ""
    return f"{where}{isa}, torch {f.get('torch')} x {f.get('torch_threads')} threads"
