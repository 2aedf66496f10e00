"""The one interface between the GSPO algorithm and the runtime that trains the policy.

The trainer (:mod:`components.gspo.trainer`) and the step batch never import the runtime
(:mod:`components.runtime`): they are handed an engine and the ranks it runs on, typed by the two
protocols below. The runtime's engines (``components.runtime.engines.TorchEngine`` and
``DeepSpeedEngine``) satisfy :class:`PolicyEngine`, and its ``DistInfo`` satisfies :class:`Ranks`;
tests hand in plain stand-ins (an object with ``module`` suffices for the log-prob paths).

``update`` is the heart of it: the engine owns gradient accumulation, the all-reduce over ranks,
clipping, the optimizer and the LR schedule; the algorithm only says which micro-batches make one
update and how each one's loss is computed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol, TypeVar

import torch
from torch import nn

T = TypeVar("T")

MicroBatch = tuple[int, Callable[[], torch.Tensor]]
"""(rows, loss_fn): loss_fn runs the micro-batch's forward and returns its mean loss over ``rows``"""


class PolicyEngine(Protocol):
    """What one GSPO step needs from a training backend."""

    @property
    def module(self) -> nn.Module:
        """The unwrapped HF model: forward passes and generation."""
        ...

    def train(self) -> None:
        """Training mode (before the updates)."""
        ...

    def eval(self) -> None:
        """Evaluation mode (before the rollouts)."""
        ...

    def gathered_parameters(self) -> AbstractContextManager[None]:
        """Full parameters available inside (ZeRO-3 gathers them; a no-op otherwise)."""
        ...

    def update(self, micro_batches: Sequence[MicroBatch]) -> float:
        """ONE optimizer update from ``micro_batches``, each loss weighted by its rows over all rows
        (so the update equals the full mini-batch's), averaged over ranks and clipped; returns the
        pre-clipping gradient norm."""
        ...


class Ranks(Protocol):
    """Where this process sits among the training ranks, and the one collective a step makes."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def all_gather(self, obj: T) -> list[T]:
        """Every rank's ``obj`` (picklable), indexed by rank; ``[obj]`` on one rank."""
        ...
