"""The DeepSpeed JSON config: the one place it is built (the engine, launchers and docs use this).

Precision settings, checked against the DeepSpeed 0.19.8 sources:

* ``bf16.enabled`` follows the dtype of the model's weights (``model.dtype``; ``auto`` is bf16 on
  a bf16-capable GPU). DeepSpeed then keeps fp32 master weights in its ZeRO / bf16 optimizer.
  An fp32 model is trained in fp32; DeepSpeed is never asked to cast the model.
* ``communication_data_type: fp32`` with bf16: DeepSpeed would otherwise reduce gradients in the
  model dtype (``engine.communication_data_type`` falls back to bf16), losing the low bits of
  averaged gradients.
* ``data_types.grad_accum_dtype: fp32`` with bf16 and ZeRO >= 1: gradients are accumulated over
  micro-batches in fp32 (stage 1 then uses ``BF16_Optimizer``, stage 2/3 fp32 gradient
  partitions). DeepSpeed refuses this mix at stage 0 (``NotImplementedError``), where it keeps
  bf16 accumulation.
* ``bf16.check_grad_overflow: true``: a step with an inf/NaN gradient is skipped (weights,
  optimizer and LR schedule untouched; ``engine.skipped_steps`` counts it), as the torch engine
  does. It is DeepSpeed 0.19.8's default, written out so a version change cannot flip it.
  fp32 ZeRO-1/2/3 skip on a non-finite gradient norm by themselves; fp32 ZeRO-0 has no such
  check, so :class:`~components.runtime.engines.DeepSpeedEngine` skips that case itself.
* float16 is refused (no loss scaling is configured).

Speed: on GPU, ZeRO-2/3 overlap gradient reduction with backward (``overlap_comm``) into
contiguous buffers. The trainer passes a torch AdamW (fused on GPU), so no DeepSpeed op is
JIT-compiled and there is no ``optimizer`` / ``scheduler`` block.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from components.config import DeepSpeedConfig, GspoConfig
from components.io import write_json_atomic
from components.runtime.training_dtype import FP16_REFUSED, PrecisionError


def default_train_dtype(on_gpu: bool) -> torch.dtype:
    """What ``model.dtype: auto`` gives: bf16 on a bf16-capable GPU, else fp32."""
    if on_gpu and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def deepspeed_config(cfg_gspo: GspoConfig, cfg_ds: DeepSpeedConfig, world_size: int, on_gpu: bool,
                     dtype: torch.dtype | None = None) -> dict[str, Any]:
    """The DeepSpeed JSON config for our loop and a model whose weights are ``dtype``.

    ``dtype`` None means "what ``model.dtype: auto`` gives on this machine"
    (:func:`default_train_dtype`). ``train_micro_batch_size_per_gpu`` and
    ``gradient_accumulation_steps`` are 1 and DeepSpeed's managed accumulation is off: the engine's
    ``update`` weights and accumulates micro-batches itself and every ``step()`` is one update
    (DeepSpeed uses the batch numbers only for bookkeeping).
    ``zero_allow_untested_optimizer`` admits torch AdamW.
    """
    dtype = default_train_dtype(on_gpu) if dtype is None else dtype
    if dtype == torch.float16:
        raise PrecisionError(f"deepspeed engine: {FP16_REFUSED}")
    if dtype not in (torch.bfloat16, torch.float32):
        raise PrecisionError(f"model.dtype: {dtype} is not a training dtype (allowed: bfloat16, float32)")
    bf16 = dtype == torch.bfloat16
    stage = int(cfg_ds.zero_stage)
    zero: dict[str, Any] = {"stage": stage}
    if stage >= 2 and on_gpu:
        zero.update({"overlap_comm": True, "contiguous_gradients": True})
    if stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "train_batch_size": int(world_size),
        "gradient_clipping": float(cfg_gspo.grad_clip),
        "zero_optimization": zero,
        "bf16": {"enabled": True, "check_grad_overflow": True} if bf16 else {"enabled": False},
        "fp16": {"enabled": False},
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 10**12,
        "wall_clock_breakdown": False,
    }
    if bf16:
        config["communication_data_type"] = "fp32"
        if stage >= 1:
            config["data_types"] = {"grad_accum_dtype": "fp32"}
    return config


def write_deepspeed_config(path: str | Path, cfg_gspo: GspoConfig, cfg_ds: DeepSpeedConfig,
                           world_size: int, on_gpu: bool, dtype: torch.dtype | None = None) -> Path:
    """Write :func:`deepspeed_config` as JSON atomically (to inspect it, or for external tools)."""
    write_json_atomic(path, deepspeed_config(cfg_gspo, cfg_ds, world_size, on_gpu, dtype))
    return Path(path)
