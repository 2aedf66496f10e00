"""Training precision: which weight dtypes may be trained, fp32 master weights, the AdamW choice.

Why fp32 master weights: bf16 has an 8-bit mantissa, so ``w + lr * update`` rounds back to ``w``
whenever the update is below ~2^-8 of the weight. At GSPO's learning rates (1e-6) AdamW's
steps are ~1e-6 per weight, far below that for weights of magnitude > 1e-4: stepping bf16
parameters directly leaves almost every weight unchanged (a CPU check changed 10 of 1,000
weights in 10 steps). :class:`MasterWeights` keeps an fp32 copy of every low-precision trainable
parameter; the optimizer updates the copy and the bf16 model weights are re-rounded from it after
each update, which is what DeepSpeed's ZeRO/bf16 optimizers do.

float16 is refused for training: its 5-bit exponent underflows small gradients to zero unless
the loss is scaled, and neither engine here scales the loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from components.runtime.training_dtype import FP16_REFUSED, PrecisionError

LOW_PRECISION = (torch.bfloat16, torch.float16)


def check_trainable_dtypes(params: Sequence[nn.Parameter], engine: str) -> torch.dtype:
    """The common dtype of ``params``; float16 (no loss scaling here) is a :class:`PrecisionError`."""
    dtypes = {p.dtype for p in params}
    if torch.float16 in dtypes:
        raise PrecisionError(f"{engine} engine: {FP16_REFUSED}")
    bad = sorted(str(d) for d in dtypes if not d.is_floating_point)
    if bad:
        raise PrecisionError(f"trainable parameters of dtype {', '.join(bad)} cannot be trained (model.dtype)")
    return torch.bfloat16 if torch.bfloat16 in dtypes else torch.float32


def adamw(params: Sequence[torch.Tensor], *, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """torch AdamW, fused (one kernel for all tensors) when every parameter lives on CUDA.

    The fused kernel is the fastest AdamW on GPU; on CPU torch's default (foreach) is used.
    """
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, **adamw_kernel_kwargs(params))


def adamw_kernel_kwargs(params: Sequence[torch.Tensor]) -> dict[str, Any]:
    """``{"fused": True}`` when every parameter is a floating CUDA tensor, else ``{}`` (torch's default)."""
    params = list(params)
    if params and all(p.device.type == "cuda" and p.dtype.is_floating_point for p in params):
        return {"fused": True}
    return {}


class MasterWeights:
    """fp32 copies of the low-precision (bf16) trainable parameters; fp32 parameters are their own master.

    ``params`` is what the optimizer steps (fp32 tensors, one per trainable parameter, same order).
    The engine writes averaged fp32 gradients into ``params[i].grad`` (:meth:`set_grad` or
    :meth:`grads_from_model`), steps the optimizer, then calls :meth:`copy_to_model`.
    """

    def __init__(self, model_params: Sequence[nn.Parameter]) -> None:
        self.model_params = list(model_params)
        self.params: list[torch.Tensor] = [
            p if p.dtype == torch.float32 else nn.Parameter(p.detach().float().clone()) for p in self.model_params]
        self.active = any(m is not p for m, p in zip(self.params, self.model_params, strict=True))
        """True when at least one parameter has a separate fp32 master copy"""

    def set_grad(self, i: int, grad: torch.Tensor) -> None:
        """Make ``grad`` (any float dtype, shape of parameter ``i``) the fp32 gradient of master ``i``."""
        master = self.params[i]
        if grad.dtype == torch.float32 and master is not self.model_params[i]:
            master.grad = grad.view_as(master)
            return
        if master.grad is None:
            master.grad = torch.empty_like(master)
        master.grad.copy_(grad.view_as(master))

    def grads_from_model(self) -> None:
        """Move the model parameters' (accumulated) gradients to the masters, upcast to fp32."""
        if not self.active:
            return
        for i, p in enumerate(self.model_params):
            if self.params[i] is p:
                continue
            self.params[i].grad = None if p.grad is None else p.grad.float()
            p.grad = None

    def drop_model_grads(self) -> None:
        """Free the model's low-precision gradients of parameters that have a separate master."""
        for m, p in zip(self.params, self.model_params, strict=True):
            if m is not p:
                p.grad = None

    @torch.no_grad()
    def copy_to_model(self) -> None:
        """Round the updated fp32 masters into the model's low-precision parameters."""
        for m, p in zip(self.params, self.model_params, strict=True):
            if m is not p:
                p.copy_(m)

    def zero_grad(self) -> None:
        for m, p in zip(self.params, self.model_params, strict=True):
            m.grad = None
            p.grad = None

    def state_dict(self) -> list[torch.Tensor | None]:
        """The fp32 masters of low-precision parameters (``None`` where the parameter is fp32)."""
        return [m.detach().clone() if m is not p else None
                for m, p in zip(self.params, self.model_params, strict=True)]

    @torch.no_grad()
    def load_state_dict(self, state: Sequence[torch.Tensor | None] | None) -> None:
        """Restore masters saved by :meth:`state_dict`; without saved masters, re-derive them from the model."""
        if state is not None and len(state) != len(self.params):
            raise PrecisionError(f"checkpoint holds {len(state)} master weights, the model has {len(self.params)} "
                                 f"trainable parameters (different model or LoRA settings?)")
        for i, (m, p) in enumerate(zip(self.params, self.model_params, strict=True)):
            if m is p:
                continue
            saved = None if state is None else state[i]
            m.copy_(saved.to(m.device) if saved is not None else p.float())
        self.copy_to_model()
