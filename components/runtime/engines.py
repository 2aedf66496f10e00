"""Training engines: one small interface over DeepSpeed and plain torch.

The GSPO trainer only ever calls ``update(micro_batches)`` once per mini-batch and uses
``engine.module`` (the unwrapped Hugging Face model) for forward passes, generation and
``save_pretrained``. The engine owns gradient accumulation:

* ``update([(rows_1, loss_fn_1), ..., (rows_k, loss_fn_k)])`` calls each ``loss_fn`` (the forward
  of one micro-batch, returning its mean loss over its ``rows`` sequences), back-propagates it
  weighted by ``rows_i / Σ rows``, then makes ONE optimizer update. The accumulated gradient is
  exactly the gradient of the mean loss over the whole mini-batch however unevenly it was split
  (tests compare it with the full-batch update, for both engines). The update averages gradients
  over ranks, clips to ``grad_clip``, steps the optimizer and the LR schedule, zeroes the
  gradients and returns the pre-clipping global gradient norm.

DeepSpeed: a torch ``AdamW`` is passed in (no JIT-compiled DeepSpeed optimizer), the config comes
from :func:`deepspeed_config` with ``managed_gradient_accumulation: false``: ``backward`` only
accumulates (``scale_wrt_gas=False``: the row weights do the scaling) and ``step()`` is the
accumulation boundary, so any number of micro-batches makes one update.

Torch: gradients are averaged over ranks by :class:`~components.runtime.grad_sync.BucketedAllReduce`
(fp32 buckets started during the last micro-batch's backward) instead of through
``DistributedDataParallel``. DDP only synchronises gradients when the forward pass goes through
the DDP wrapper, but the trainer runs forwards through ``engine.module`` (the same object used for
generation); the hook-driven all-reduce is correct however the forward was called. bf16 weights
are trained through fp32 master copies (:mod:`components.runtime.precision`).

Both engines skip an update whose gradient norm is not finite (weights, optimizer state and LR
schedule untouched) and count it in ``skipped_steps``; ``optimizer_steps`` counts applied updates.
"""

from __future__ import annotations

import contextlib
import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from components.config import DeepSpeedConfig, GspoConfig
from components.errors import UserError
from components.gspo.policy_engine import MicroBatch
from components.runtime.distributed import DistInfo, dist_info, init_distributed, is_distributed
from components.runtime.ds_config import deepspeed_config, write_deepspeed_config
from components.runtime.grad_sync import DEFAULT_BUCKET_MB, BucketedAllReduce
from components.runtime.precision import MasterWeights, adamw, check_trainable_dtypes
from components.runtime.schedule import build_scheduler

__all__ = ["DeepSpeedEngine", "EngineUsageError", "TorchEngine", "TrainEngine", "build_engine", "deepspeed_config",
           "planned_updates", "write_deepspeed_config"]

TORCH_STATE_FILE = "engine_state.pt"
DS_STATE_DIR = "deepspeed"
DS_TAG = "state"



class EngineUsageError(UserError):
    """The engine was driven in a way that would silently train wrongly (e.g. an empty update)."""


class TrainEngine(ABC):
    """A training backend; satisfies :class:`components.gspo.policy_engine.PolicyEngine`, the
    trainer's view of it (see the module docstring for semantics)."""

    kind: str = "abstract"
    """``deepspeed`` or ``torch`` (written into checkpoint metadata)"""
    restores_weights: bool = False
    """True when ``load_checkpoint_state`` also restores the module weights"""

    def __init__(self, info: DistInfo) -> None:
        self.dist = info

    # -- model access -------------------------------------------------------------------------
    @property
    @abstractmethod
    def module(self) -> nn.Module:
        """The unwrapped HF model: forward passes, ``generate`` and ``save_pretrained``."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def train(self) -> None:
        self.module.train()

    def eval(self) -> None:
        self.module.eval()

    @contextlib.contextmanager
    def gathered_parameters(self) -> Iterator[None]:
        """Full parameters available inside (ZeRO-3 gathers them; a no-op otherwise)."""
        yield

    # -- optimisation -------------------------------------------------------------------------
    def update(self, micro_batches: Sequence[MicroBatch]) -> float:
        """One optimizer update from rows-weighted micro-batches (see the module docstring); grad norm."""
        rows = [int(r) for r, _ in micro_batches]
        if not rows:
            raise EngineUsageError("update() needs at least one micro-batch")
        if min(rows) < 1:
            raise EngineUsageError(f"update(): every micro-batch needs >= 1 row, got {rows}")
        for k, (r, loss_fn) in enumerate(micro_batches):
            loss = loss_fn()
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise EngineUsageError(f"a micro-batch loss must be a scalar tensor, got {type(loss).__name__} "
                                       f"{tuple(getattr(loss, 'shape', ()))}")
            self._backward(loss * (r / sum(rows)), last=k == len(rows) - 1)
        return self._step()

    @abstractmethod
    def _backward(self, loss: torch.Tensor, last: bool) -> None:
        """Accumulate the gradient of an already weighted micro-batch loss (``last``: the update's last)."""

    @abstractmethod
    def _step(self) -> float:
        """Average over ranks, clip, update, advance the schedule, zero the gradients; grad norm."""

    @property
    @abstractmethod
    def lr(self) -> float:
        """Learning rate the next update will use."""

    @property
    @abstractmethod
    def optimizer_steps(self) -> int:
        """Optimizer updates applied so far (restored by checkpoints)."""

    # -- checkpoint state -----------------------------------------------------------------------
    @abstractmethod
    def save_checkpoint_state(self, folder: Path) -> None:
        """Write optimizer, scheduler and engine counters into ``folder``. Collective: all ranks call."""

    @abstractmethod
    def load_checkpoint_state(self, folder: Path) -> None:
        """Restore what :meth:`save_checkpoint_state` wrote. Collective: all ranks call."""


def _trainable(model: nn.Module) -> list[nn.Parameter]:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise EngineUsageError("model has no trainable parameters (requires_grad=False everywhere)")
    return params


class TorchEngine(TrainEngine):
    """Plain torch: AdamW + LambdaLR, bucketed fp32 gradient all-reduce when WORLD_SIZE > 1.

    bf16 trainable parameters get fp32 master copies (:class:`MasterWeights`): AdamW steps the
    fp32 copies and the model's bf16 weights are rounded from them after every update. A
    non-finite gradient norm skips the update (weights, optimizer and schedule untouched) and
    counts it in ``skipped_steps``: one bad batch must not turn the policy into NaNs.
    """

    kind = "torch"

    def __init__(self, model: nn.Module, cfg_gspo: GspoConfig, total_steps: int = 1, *, info: DistInfo | None = None,
                 bucket_mb: float = DEFAULT_BUCKET_MB) -> None:
        """``cfg_gspo`` gives the optimizer and schedule (``lr``, ``weight_decay``, ``grad_clip``,
        ``lr_schedule``, ``warmup_steps``, ``lr_min_ratio``); ``total_steps`` = optimizer updates."""
        info = info or (init_distributed() if not is_distributed() else dist_info())
        super().__init__(info)
        self._model = model.to(info.device)
        self.grad_clip = cfg_gspo.grad_clip
        self._params = _trainable(self._model)
        check_trainable_dtypes(self._params, engine="torch")
        self._reducer: BucketedAllReduce | None = None
        if is_distributed() and dist.get_world_size() > 1:
            # what DDP does at construction: every rank starts from rank 0's weights
            for t in list(self._model.parameters()) + list(self._model.buffers()):
                dist.broadcast(t.data, src=0)
            self._reducer = BucketedAllReduce(self._params, bucket_mb)
        self.master = MasterWeights(self._params)
        self.optimizer = adamw(self.master.params, lr=cfg_gspo.lr, weight_decay=cfg_gspo.weight_decay)
        self.scheduler = build_scheduler(self.optimizer, cfg_gspo.lr_schedule, cfg_gspo.warmup_steps, total_steps,
                                         cfg_gspo.lr_min_ratio)
        self._steps = 0
        self.skipped_steps = 0

    @property
    def module(self) -> nn.Module:
        return self._model

    def _backward(self, loss: torch.Tensor, last: bool) -> None:
        if self._reducer is not None and last:
            self._reducer.arm()  # last micro-batch: all-reduce buckets while backward still runs
        loss.backward()

    def _collect_grads(self) -> None:
        """Averaged (over ranks) fp32 gradients into the master parameters' ``.grad``."""
        if self._reducer is not None:
            self._reducer.finish(self.master.set_grad)
            self.master.drop_model_grads()  # the low-precision local gradients are spent
        else:
            self.master.grads_from_model()

    def _step(self) -> float:
        self._collect_grads()
        norm = float(torch.nn.utils.clip_grad_norm_(self.master.params, self.grad_clip))
        if not math.isfinite(norm):
            self.skipped_steps += 1
        else:
            self.optimizer.step()
            self.master.copy_to_model()
            self.scheduler.step()
            self._steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.master.zero_grad()
        return norm

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    @property
    def optimizer_steps(self) -> int:
        return self._steps

    def state_dict_for_checkpoint(self) -> dict[str, Any]:
        """Optimizer, scheduler and counters (replicated on every rank, so rank 0's copy suffices)."""
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "steps": self._steps, "skipped_steps": self.skipped_steps, "master": self.master.state_dict()}

    def load_state_dict_from_checkpoint(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict_for_checkpoint`; a state without its parts is a ValueError (the
        checkpoint loader names the file) before anything is applied."""
        missing = [k for k in ("optimizer", "scheduler", "steps") if not isinstance(state, dict) or k not in state]
        if missing:
            raise ValueError(f"torch engine state lacks {missing}")
        if not all(isinstance(state[k], dict) for k in ("optimizer", "scheduler")):
            raise ValueError("torch engine state: optimizer and scheduler states must be mappings")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self._steps = int(state["steps"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.master.load_state_dict(state.get("master"))  # fp32 masters: bit-exact resume of bf16 training
        if self._reducer is not None:
            self._reducer.reset()

    def save_checkpoint_state(self, folder: Path) -> None:
        if self.dist.is_main:
            folder.mkdir(parents=True, exist_ok=True)
            torch.save(self.state_dict_for_checkpoint(), folder / TORCH_STATE_FILE)

    def load_checkpoint_state(self, folder: Path) -> None:
        path = folder / TORCH_STATE_FILE
        if not path.is_file():
            raise EngineUsageError(f"{path}: missing torch engine state (was the checkpoint written by "
                                   f"the deepspeed engine? set gspo.engine accordingly)")
        self.load_state_dict_from_checkpoint(torch.load(path, map_location=self.dist.device, weights_only=True))


class DeepSpeedEngine(TrainEngine):
    """``deepspeed.initialize`` over the HF model with a torch AdamW and our LambdaLR.

    Checkpoint state goes through DeepSpeed's own ``save_checkpoint``/``load_checkpoint`` (each
    rank writes its ZeRO optimizer shard; module weights and the LR scheduler are included), the
    simplest option that is correct for every ZeRO stage and world size layout.
    """

    kind = "deepspeed"
    restores_weights = True

    def __init__(self, model: nn.Module, cfg_gspo: GspoConfig, cfg_ds: DeepSpeedConfig, total_steps: int) -> None:
        info = init_distributed(for_deepspeed=True)  # idempotent; DeepSpeed needs its comm backend
        import deepspeed  # imported here: the torch path must work without DeepSpeed installed

        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        super().__init__(info)
        self.zero_stage = int(cfg_ds.zero_stage)
        on_gpu = torch.cuda.is_available()
        params = _trainable(model)
        dtype = check_trainable_dtypes(params, engine="deepspeed")
        self.config = deepspeed_config(cfg_gspo, cfg_ds, info.world_size, on_gpu, dtype=dtype)
        optimizer = adamw(params, lr=cfg_gspo.lr, weight_decay=cfg_gspo.weight_decay)
        scheduler = build_scheduler(optimizer, cfg_gspo.lr_schedule, cfg_gspo.warmup_steps, total_steps,
                                    cfg_gspo.lr_min_ratio)
        self._ds, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=self.config)

    @property
    def module(self) -> nn.Module:
        return self._ds.module

    def train(self) -> None:
        self._ds.train()

    def eval(self) -> None:
        self._ds.eval()

    @contextlib.contextmanager
    def gathered_parameters(self) -> Iterator[None]:
        if self.zero_stage != 3:
            yield
            return
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=None):
            yield

    def _backward(self, loss: torch.Tensor, last: bool) -> None:
        self._ds.backward(loss, scale_wrt_gas=False)  # unmanaged accumulation: step() is the boundary

    def _local_grad_norm(self) -> float | None:
        """Stage 0 fp32: DeepSpeed clips but does not record the norm, so measure it here. The
        gradients are averaged over ranks first (``step()`` averages again: a no-op on equal
        tensors), so every rank sees the same norm and takes the same skip decision."""
        if self.zero_stage != 0 or self.config["bf16"]["enabled"]:
            return None
        if self.dist.world_size > 1:
            self._ds.allreduce_gradients()
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        return float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0

    def _skip_step(self) -> None:
        """Stage 0 fp32 has no overflow check in DeepSpeed: skip a non-finite update here.

        DeepSpeed's ``step()`` still runs (its counters must advance) with every gradient dropped,
        so AdamW touches nothing, and with the optimizer flagged ``overflow`` as DeepSpeed's own
        mixed-precision optimizers flag it: the LR schedule stays, ``skipped_steps`` (checkpointed)
        counts it. Clipping is paused: DeepSpeed's stage-0 clip fails when there is no gradient.
        """
        self._ds.zero_grad()
        config, clip = self._ds._config, self._ds._config.gradient_clipping
        self.optimizer.overflow = True
        config.gradient_clipping = 0.0
        try:
            self._ds.step()
        finally:
            config.gradient_clipping = clip
            del self.optimizer.overflow

    def _step(self) -> float:
        before = self._local_grad_norm()
        if before is not None and not math.isfinite(before):
            self._skip_step()
            return before
        self._ds.step()
        self._ds.zero_grad()
        norm = self._ds.get_global_grad_norm()
        if norm is None:
            norm = before if before is not None else float("nan")
        return float(norm)

    @property
    def lr(self) -> float:
        return float(self._ds.get_lr()[0])

    @property
    def optimizer_steps(self) -> int:
        """Applied updates (DeepSpeed's ``global_steps`` also counts skipped ones)."""
        return int(self._ds.global_steps) - self.skipped_steps

    @property
    def skipped_steps(self) -> int:
        """Updates skipped for a non-finite gradient (restored by checkpoints)."""
        return int(self._ds.skipped_steps)

    def save_checkpoint_state(self, folder: Path) -> None:
        self._ds.save_checkpoint(str(folder / DS_STATE_DIR), tag=DS_TAG, save_latest=False)

    def load_checkpoint_state(self, folder: Path) -> None:
        path = folder / DS_STATE_DIR / DS_TAG
        if not path.is_dir():
            raise EngineUsageError(f"{path}: missing DeepSpeed state (was the checkpoint written by the torch "
                                   f"engine? set gspo.engine accordingly)")
        loaded, _ = self._ds.load_checkpoint(str(folder / DS_STATE_DIR), tag=DS_TAG, load_optimizer_states=True,
                                             load_lr_scheduler_states=True)
        if loaded is None:
            raise EngineUsageError(f"{path}: DeepSpeed could not load this checkpoint (world size or ZeRO "
                                   f"stage changed since it was written?)")


def planned_updates(cfg_gspo: GspoConfig) -> int:
    """Optimizer updates of a full run (one per mini-batch of every step): the LR schedule's length.
    With ``gspo.steps`` instead, a cosine or linear schedule would end after 1/minibatches of the run."""
    return int(cfg_gspo.steps) * int(cfg_gspo.minibatches)


def build_engine(model: nn.Module, cfg_gspo: GspoConfig, cfg_ds: DeepSpeedConfig, total_steps: int) -> TrainEngine:
    """The engine named by ``gspo.engine``; ``total_steps`` = optimizer updates (steps x minibatches)."""
    if total_steps < 1:
        raise EngineUsageError(f"total_steps={total_steps} must be >= 1 (gspo.steps x gspo.minibatches)")
    if cfg_gspo.engine == "deepspeed":
        return DeepSpeedEngine(model, cfg_gspo, cfg_ds, total_steps)
    if cfg_gspo.engine == "torch":
        return TorchEngine(model, cfg_gspo, total_steps)
    raise EngineUsageError(f"gspo.engine: unknown engine {cfg_gspo.engine!r} (allowed: deepspeed, torch)")
