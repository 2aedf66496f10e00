"""Bucketed gradient all-reduce that overlaps with the last micro-batch's backward pass.

Why not ``DistributedDataParallel``: DDP only synchronises when the forward runs through its
wrapper, while the trainer runs forwards through the bare Hugging Face module (the same object
generates rollouts). This class does what DDP's reducer does, driven by per-parameter
``post_accumulate_grad_hook``\\ s instead of the wrapper:

* Trainable parameters are grouped, in reverse registration order (roughly the order backward
  produces their gradients), into buckets of about ``bucket_mb`` MiB.
* During the backward of the *last* micro-batch before an update (:meth:`arm`), a bucket is
  copied into its flat fp32 buffer and its ``all_reduce`` is started asynchronously as soon as
  every parameter in it has its final gradient, so communication overlaps the rest of backward.
* Buckets are always started in index order, on every rank, so collectives match across ranks
  even when a parameter gets no gradient on some rank (its bucket is started in :meth:`finish`
  with zeros for the missing gradient, as DDP with ``find_unused_parameters`` would).

Reductions run in fp32 whatever the parameter dtype: summing bf16 gradients over many ranks
would lose the low bits that the fp32 master weights exist to keep.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from components.errors import UserError

DEFAULT_BUCKET_MB = 25.0


class GradSyncError(UserError):
    """Gradients arrived in a way the bucketed all-reduce cannot average correctly."""


@dataclass
class _Bucket:
    indices: list[int]
    """positions (in the reducer's parameter list) of this bucket's parameters"""
    offsets: list[int]
    """start of each parameter's slice in ``buffer``"""
    numel: int
    buffer: torch.Tensor | None = None
    """flat fp32 [numel] buffer on the parameters' device, allocated on first use"""
    ready: set[int] = field(default_factory=set)
    work: dist.Work | None = None


class BucketedAllReduce:
    """Average the gradients of ``params`` over the default process group, bucket by bucket.

    Use per update: :meth:`arm` before the last micro-batch's backward, then :meth:`finish`
    after it, which yields ``(param index, averaged fp32 gradient [param shape])`` pairs through
    ``deliver``. Without :meth:`arm` (e.g. a single micro-batch engine that did not arm), every
    bucket is reduced in :meth:`finish`, which is still correct, only without overlap.
    """

    def __init__(self, params: Sequence[nn.Parameter], bucket_mb: float = DEFAULT_BUCKET_MB) -> None:
        self.params = list(params)
        self.world = dist.get_world_size()
        limit = max(1, int(bucket_mb * 2**20 / 4))  # fp32 elements per bucket
        self.buckets: list[_Bucket] = []
        self.bucket_of: dict[int, int] = {}
        current: list[int] = []
        size = 0
        for i in reversed(range(len(self.params))):
            current.append(i)
            size += self.params[i].numel()
            if size >= limit:
                self._add_bucket(current)
                current, size = [], 0
        if current:
            self._add_bucket(current)
        self._armed = False
        self._next = 0
        self._handles = [p.register_post_accumulate_grad_hook(self._make_hook(i)) for i, p in enumerate(self.params)]

    def _add_bucket(self, indices: list[int]) -> None:
        offsets, total = [], 0
        for i in indices:
            offsets.append(total)
            total += self.params[i].numel()
            self.bucket_of[i] = len(self.buckets)
        self.buckets.append(_Bucket(list(indices), offsets, total))

    def _make_hook(self, i: int) -> Callable[[torch.Tensor], None]:
        def hook(_: torch.Tensor) -> None:
            if not self._armed:
                return
            bucket = self.buckets[self.bucket_of[i]]
            if bucket.work is not None:
                raise GradSyncError(
                    f"parameter {i} received a second gradient in one backward pass after its bucket was "
                    f"all-reduced (reentrant gradient checkpointing or a parameter reused across checkpointed "
                    f"segments); use non-reentrant checkpointing")
            bucket.ready.add(i)
            self._launch_ready()
        return hook

    def arm(self) -> None:
        """The next backward is the last before :meth:`finish`: start buckets as they become ready."""
        self._armed = True

    def _launch(self, bucket: _Bucket) -> None:
        first = self.params[bucket.indices[0]]
        if bucket.buffer is None:
            bucket.buffer = torch.empty(bucket.numel, dtype=torch.float32, device=first.device)
        for i, off in zip(bucket.indices, bucket.offsets, strict=True):
            p = self.params[i]
            view = bucket.buffer[off: off + p.numel()]
            if p.grad is None:
                view.zero_()
            else:
                view.copy_(p.grad.reshape(-1))
        bucket.work = dist.all_reduce(bucket.buffer, op=dist.ReduceOp.SUM, async_op=True)

    def _launch_ready(self) -> None:
        """Start, in index order, every bucket whose parameters all have their final gradient."""
        while self._next < len(self.buckets):
            bucket = self.buckets[self._next]
            if len(bucket.ready) < len(bucket.indices):
                return
            self._launch(bucket)
            self._next += 1

    @property
    def launched(self) -> int:
        """Buckets whose all-reduce has been started for the current update."""
        return self._next

    def finish(self, deliver: Callable[[int, torch.Tensor], None]) -> None:
        """Start the remaining buckets, wait for all, hand each averaged fp32 gradient to ``deliver``."""
        while self._next < len(self.buckets):
            self._launch(self.buckets[self._next])
            self._next += 1
        for bucket in self.buckets:
            assert bucket.work is not None and bucket.buffer is not None
            bucket.work.wait()
            bucket.buffer.div_(self.world)
            for i, off in zip(bucket.indices, bucket.offsets, strict=True):
                p = self.params[i]
                deliver(i, bucket.buffer[off: off + p.numel()].view(p.shape))
        self.reset()

    def reset(self) -> None:
        """Forget the current update (after :meth:`finish`, or when an update is abandoned)."""
        for bucket in self.buckets:
            if bucket.work is not None:
                bucket.work.wait()  # never leave a started collective behind
            bucket.work = None
            bucket.ready.clear()
        self._armed = False
        self._next = 0

    def close(self) -> None:
        """Remove the gradient hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []
