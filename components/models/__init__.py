"""Model + tokenizer loading: aliases, GGUF conversion, LoRA (tiny test models live in ``tiny``)."""

from components.models.loading import (
    ALIASES,
    DeviceError,
    PolicyInit,
    default_device,
    load_policy,
    prepare_tokenizer,
    resolve_dtype,
)
from components.models.lora import LoraError, apply_lora, disabled_adapters, has_adapters
from components.models.smollm2 import ModelNotFoundError

__all__ = ["ALIASES", "DeviceError", "LoraError", "ModelNotFoundError", "PolicyInit", "apply_lora", "default_device",
           "disabled_adapters", "has_adapters", "load_policy", "prepare_tokenizer", "resolve_dtype"]
