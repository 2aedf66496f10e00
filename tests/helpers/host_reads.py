"""Counting host reads of device tensors (what a CUDA graph capture forbids) in unit tests."""

from __future__ import annotations

import torch

READS = ("__bool__", "item", "tolist", "cpu", "__int__", "__float__", "__index__", "nonzero", "numpy")


def count_host_reads(monkeypatch) -> dict[str, int]:
    """Wrap the Tensor methods that read a tensor on the host; returns the live counter ``{"n": ...}``."""
    counts = {"n": 0}
    for name in READS:
        real = getattr(torch.Tensor, name)

        def counted(self, *a, _real=real, **k):
            counts["n"] += 1
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return counts
