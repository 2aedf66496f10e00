"""Which ``model.dtype`` a training may use, checked before anything loads torch.

Apart from :mod:`components.runtime.precision` (torch: master weights, AdamW) because the
launching process refuses ``float16`` before any rank starts, and that process never loads torch.
"""

from __future__ import annotations

from components.errors import UserError


class PrecisionError(UserError):
    """A weight dtype that this engine cannot train correctly."""


FP16_REFUSED = ("model.dtype=float16 cannot be trained: fp16 gradients underflow without loss scaling, which this "
                "project does not do. Use model.dtype bfloat16 (or auto) or float32.")


def check_training_dtype_setting(dtype: str) -> None:
    """Refuse ``model.dtype: float16`` before a training run starts (evaluation may still use it)."""
    if dtype in ("float16", "fp16"):
        raise PrecisionError(FP16_REFUSED)
