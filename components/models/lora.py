"""LoRA adapters through peft, and the adapters-off view used as the KL reference policy.

With LoRA the frozen base weights *are* the reference policy: turning the adapters off gives
pi_ref without a second copy of the model in memory (what TRL does for PEFT models too).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from components.errors import UserError


class LoraError(UserError):
    """Bad LoRA settings (rank, alpha, target modules)."""


def apply_lora(model: torch.nn.Module, rank: int, alpha: int | float,
               target_modules: list[str] | str | None = None, dropout: float = 0.0) -> Any:
    """Wrap ``model`` in a peft ``PeftModel`` with LoRA adapters of ``rank`` and ``alpha``.

    ``target_modules=None`` uses peft's default for the architecture (``q_proj``/``v_proj`` for
    Llama, the SmolLM2 family) and falls back to ``"all-linear"`` for architectures peft does
    not know (e.g. a custom tiny test model). Only adapter weights are trainable afterwards.
    """
    from peft import LoraConfig, get_peft_model
    from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

    if not isinstance(rank, int) or rank <= 0:
        raise LoraError(f"model.lora_rank: must be a positive integer to apply LoRA (got {rank!r})")
    if alpha <= 0:
        raise LoraError(f"model.lora_alpha: must be > 0 (got {alpha!r})")
    if target_modules is None:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        if model_type not in TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING:
            target_modules = "all-linear"
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules,
                        bias="none", task_type="CAUSAL_LM")
    try:
        with warnings.catch_warnings():  # peft reads transformers' deprecated alias: not the caller's to fix
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
            return get_peft_model(model, config)
    except ValueError as exc:
        raise LoraError(f"LoRA target_modules {target_modules!r} do not match the model: {exc}") from exc


def has_adapters(model: torch.nn.Module) -> bool:
    """True when ``model`` is a peft model (so :func:`disabled_adapters` yields the base)."""
    from peft import PeftModel

    return isinstance(model, PeftModel)


@contextlib.contextmanager
def disabled_adapters(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Run the block with LoRA adapters off: forwards inside compute the base (reference) policy.

    A model without adapters is yielded unchanged. Caution: for full fine-tuning that is the
    *current* policy, not a reference; the trainer must keep a frozen copy for the KL term then
    (check :func:`has_adapters`).
    """
    if has_adapters(model):
        with model.disable_adapter():
            yield model
    else:
        yield model
