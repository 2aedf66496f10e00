"""The pieces of one rollout that are not the engine itself: its options, its throughput, the
context every batched call of it shares, and how a call's rows are split by prompt length."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from components.mas.decode import LogitsProcessor, Sampling
from components.mas.prefill import PrefixStore


@dataclass(frozen=True)
class EngineOptions:
    """How an engine departs from a team of ``mas.agents`` speaking its role prompts (see
    :class:`components.mas.engine.RolloutEngine`): ``roles`` overrides the rotated role names;
    ``solo`` prompts every agent as a lone solver (no team, no silence; single-agent CoT and
    self-consistency); ``logits_processor`` and ``min_new_tokens`` go to the decoder (tests force
    silence with the first; benchmarks fix lengths with the second)."""

    roles: tuple[str, ...] | None = None
    solo: bool = False
    logits_processor: LogitsProcessor | None = None
    min_new_tokens: int = 0


@dataclass
class RolloutStats:
    """Throughput of the last :meth:`RolloutEngine.rollout` (for ``perf/rollout_tokens_per_s``)."""

    episodes: int = 0
    calls: int = 0
    decode_steps: int = 0
    generated_tokens: int = 0
    generate_s: float = 0.0
    total_s: float = 0.0
    prefix_tokens_reused: int = 0
    """prompt tokens not prefilled: served from the prefix store or from heads shared across rows"""

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.generate_s if self.generate_s > 0 else 0.0


@dataclass(frozen=True)
class CallContext:
    """What every batched call of one rollout shares: how to sample, the random stream, the frame
    prefixes' KV reused across rounds (None: one round, nothing to reuse) and the counters."""

    sampling: Sampling
    generator: torch.Generator
    store: PrefixStore | None
    stats: RolloutStats


def length_buckets(lengths: list[int], *, max_ratio: float = 2.0, min_rows: int = 8) -> list[list[int]]:
    """Group row indices by prompt length so a batched call pads little.

    Rows are sorted by length; a bucket closes when the next prompt is more than ``max_ratio``
    times its shortest one and it already has ``min_rows`` rows. Left-padding every row to the
    longest prompt of a call made prompt-heavy batches (MMLU: 1,237 vs 560 tokens on average)
    slower than one row at a time; a handful of buckets keeps the batching win. Each bucket runs
    its own decode loop, so buckets split only at a 2x length ratio (GSM8K prompts of 174–383
    tokens stay one call). Deterministic. ``max_ratio=math.inf``: one bucket (what the engine
    uses on CUDA, see :attr:`RolloutEngine.bucket_ratio`).
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    buckets: list[list[int]] = []
    for i in order:
        if buckets and (lengths[i] <= max_ratio * max(1, lengths[buckets[-1][0]]) or len(buckets[-1]) < min_rows):
            buckets[-1].append(i)
        else:
            buckets.append([i])
    return buckets
