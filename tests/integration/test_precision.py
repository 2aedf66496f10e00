"""Training precision: fp32 master weights for bf16, float16 refused, DeepSpeed precision settings,
non-finite updates skipped alike by every engine and ZeRO stage, the AdamW kernel choice."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch
import transformers

from components.config import DeepSpeedConfig, GspoConfig
from components.runtime.ds_config import deepspeed_config
from components.runtime.engines import TorchEngine, build_engine
from components.runtime.precision import adamw_kernel_kwargs
from components.runtime.training_dtype import PrecisionError, check_training_dtype_setting

VOCAB = 64


def tiny_model(seed: int = 0, dtype: torch.dtype = torch.float32) -> transformers.LlamaForCausalLM:
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=True)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).to(dtype)


def lm_loss(model: torch.nn.Module, seed: int) -> torch.Tensor:
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(seed))  # [B=2, T=8]
    return model(input_ids=ids, labels=ids).loss


def _floats(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().clone() for k, v in model.state_dict().items()}


def test_bf16_training_changes_the_weights_as_fp32_does() -> None:
    """lr 1e-6, 10 updates: each AdamW step (~1e-6) is far below bf16's resolution of the weights, so
    stepping bf16 parameters directly loses most updates. With fp32 master weights the bf16 model is
    the rounding of what fp32 training gives, and the master update equals the fp32 one."""
    base = tiny_model(dtype=torch.bfloat16)
    start = _floats(base)
    runs = {}
    for dtype in (torch.float32, torch.bfloat16):
        eng = TorchEngine(copy.deepcopy(base).to(dtype), GspoConfig(lr=1e-6, grad_clip=1.0))
        for i in range(10):
            eng.update([(2, lambda i=i, eng=eng: lm_loss(eng.module, i))])
        runs[dtype] = eng
    ref = _floats(runs[torch.float32].module)
    ref_rounded = {k: v.to(torch.bfloat16).float() for k, v in ref.items()}
    got = _floats(runs[torch.bfloat16].module)
    n_ref = sum(int((ref_rounded[k] != start[k]).sum()) for k in start)
    n_got = sum(int((got[k] != start[k]).sum()) for k in start)
    agree = sum(int((got[k] == ref_rounded[k]).sum()) for k in start) / sum(v.numel() for v in start.values())
    assert n_ref > 100 and abs(n_got - n_ref) <= 0.05 * n_ref, (n_got, n_ref)
    assert agree > 0.995

    eng = runs[torch.bfloat16]
    names = [n for n, p in eng.module.named_parameters() if p.requires_grad]
    master = dict(zip(names, eng.master.params, strict=True))
    assert all(m.dtype == torch.float32 for m in master.values())
    update = torch.cat([(master[k].detach() - start[k]).flatten() for k in names])
    update_ref = torch.cat([(ref[k] - start[k]).flatten() for k in names])
    assert torch.nn.functional.cosine_similarity(update, update_ref, dim=0) > 0.999
    for k in names:  # the model's bf16 weights are exactly the rounded masters
        assert torch.equal(eng.module.state_dict()[k], master[k].detach().to(torch.bfloat16)), k


def test_bf16_master_weights_survive_a_checkpoint_round_trip() -> None:
    """Resuming bf16 training restores the fp32 masters, not their bf16 rounding."""
    eng = TorchEngine(tiny_model(dtype=torch.bfloat16), GspoConfig(lr=1e-4))
    for i in range(3):
        eng.update([(2, lambda i=i, eng=eng: lm_loss(eng.module, i))])
    state = copy.deepcopy(eng.state_dict_for_checkpoint())
    fresh = TorchEngine(copy.deepcopy(eng.module), GspoConfig(lr=1e-4))  # masters re-derived from bf16 weights
    assert any(not torch.equal(a, b) for a, b in zip(fresh.master.params, eng.master.params, strict=True))
    fresh.load_state_dict_from_checkpoint(state)
    for a, b in zip(fresh.master.params, eng.master.params, strict=True):
        assert torch.equal(a, b)
    for engine in (eng, fresh):
        engine.update([(2, lambda engine=engine: lm_loss(engine.module, 9))])
    for a, b in zip(fresh.module.parameters(), eng.module.parameters(), strict=True):
        assert torch.equal(a, b)


def test_fp32_training_keeps_no_copy() -> None:
    eng = TorchEngine(tiny_model(), GspoConfig(lr=1e-3))
    assert not eng.master.active
    assert all(m is p for m, p in zip(eng.master.params, eng.module.parameters(), strict=True))


def test_float16_training_is_refused_with_the_key_named() -> None:
    with pytest.raises(PrecisionError, match="model.dtype=float16"):
        TorchEngine(tiny_model(dtype=torch.float16), GspoConfig(lr=1e-3))
    with pytest.raises(PrecisionError, match="model.dtype=float16"):
        deepspeed_config(GspoConfig(), DeepSpeedConfig(), 1, on_gpu=True, dtype=torch.float16)
    with pytest.raises(PrecisionError, match="model.dtype=float16"):
        check_training_dtype_setting("float16")
    check_training_dtype_setting("auto")


def test_launch_refuses_float16_before_starting_ranks() -> None:
    from components.config import load_config
    from components.runtime.launch import launch_training

    cfg = load_config(overrides=["model.dtype=float16", "deepspeed.launcher=torchrun"])
    with pytest.raises(PrecisionError, match="model.dtype=float16"):
        launch_training(cfg, [])


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_deepspeed_precision_settings(stage: int) -> None:
    """bf16: fp32 gradient reduction and accumulation, overflow check on; fp32: DeepSpeed's defaults.
    The dicts are parsed by DeepSpeed's own config class, which resolves the same dtypes."""
    ds_config = pytest.importorskip("deepspeed.runtime.config")
    g, ds = GspoConfig(grad_accum=2), DeepSpeedConfig(zero_stage=stage)
    bf16 = deepspeed_config(g, ds, world_size=1, on_gpu=True, dtype=torch.bfloat16)
    fp32 = deepspeed_config(g, ds, world_size=1, on_gpu=True, dtype=torch.float32)
    cpu = deepspeed_config(g, ds, world_size=1, on_gpu=False, dtype=torch.bfloat16)
    assert bf16["bf16"] == {"enabled": True, "check_grad_overflow": True} and fp32["bf16"]["enabled"] is False
    assert bf16["communication_data_type"] == "fp32" and "communication_data_type" not in fp32
    assert bf16.get("data_types") == ({"grad_accum_dtype": "fp32"} if stage >= 1 else None)
    assert fp32["fp16"]["enabled"] is False and "optimizer" not in bf16
    assert bf16["zero_optimization"].get("overlap_comm", False) is (stage >= 2)
    assert "overlap_comm" not in cpu["zero_optimization"]  # CUDA streams only
    parsed = ds_config.DeepSpeedConfig(bf16)
    assert parsed.communication_data_type == torch.float32 and parsed.bfloat16_config.check_grad_overflow
    assert parsed.zero_optimization_stage == stage
    assert (parsed.grad_accum_dtype == "fp32") is (stage >= 1)
    if stage >= 2:
        assert parsed.zero_config.overlap_comm is True
    assert ds_config.DeepSpeedConfig(fp32).communication_data_type is None  # DeepSpeed's own fp32 default


def test_deepspeed_config_default_dtype_is_what_auto_gives(monkeypatch) -> None:
    g, ds = GspoConfig(), DeepSpeedConfig()
    assert deepspeed_config(g, ds, 1, on_gpu=False)["bf16"]["enabled"] is False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert deepspeed_config(g, ds, 1, on_gpu=True)["bf16"]["enabled"] is False  # e.g. a V100
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert deepspeed_config(g, ds, 1, on_gpu=True)["bf16"]["enabled"] is True


def test_adamw_is_fused_on_cuda_only() -> None:
    cuda = SimpleNamespace(device=torch.device("cuda", 0), dtype=torch.bfloat16)
    cpu = SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32)
    assert adamw_kernel_kwargs([cuda, cuda]) == {"fused": True}
    assert adamw_kernel_kwargs([cuda, cpu]) == {} and adamw_kernel_kwargs([cpu]) == {}
    eng = TorchEngine(tiny_model(), GspoConfig(lr=1e-3))
    assert not eng.optimizer.defaults.get("fused")


# ------------------------------------------------------------------ non-finite updates, every engine

@pytest.fixture()
def world1(monkeypatch):
    """Single-rank process-group environment on a free port; the group is destroyed afterwards."""
    from components.runtime.distributed import free_port, shutdown_distributed

    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, value)
    yield
    shutdown_distributed()


def _nan_then_good(eng) -> None:
    def weights() -> dict[str, torch.Tensor]:
        with eng.gathered_parameters():
            return _floats(eng.module)

    start, lr0 = weights(), eng.lr
    assert not math.isfinite(eng.update([(2, lambda: lm_loss(eng.module, 0)),
                                         (2, lambda: lm_loss(eng.module, 1) * float("nan"))]))
    assert all(torch.equal(v, start[k]) for k, v in weights().items()), "a NaN update reached the weights"
    assert (eng.skipped_steps, eng.optimizer_steps, eng.lr) == (1, 0, lr0)
    assert math.isfinite(eng.update([(2, lambda: lm_loss(eng.module, 0)), (2, lambda: lm_loss(eng.module, 1))]))
    assert any(not torch.equal(v, start[k]) for k, v in weights().items())
    assert (eng.skipped_steps, eng.optimizer_steps) == (1, 1) and eng.lr < lr0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_torch_engine_skips_non_finite_updates(dtype: torch.dtype) -> None:
    g = GspoConfig(engine="torch", lr=1e-2, grad_accum=2, lr_schedule="linear")
    _nan_then_good(build_engine(tiny_model(dtype=dtype), g, DeepSpeedConfig(), total_steps=10))


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_deepspeed_skips_non_finite_updates(world1, stage: int, dtype: torch.dtype) -> None:
    """Like the torch engine: weights, LR schedule untouched, ``skipped_steps`` 1, ``optimizer_steps`` 0."""
    pytest.importorskip("deepspeed")
    g = GspoConfig(engine="deepspeed", lr=1e-2, grad_accum=2, lr_schedule="linear")
    _nan_then_good(build_engine(tiny_model(dtype=dtype), g, DeepSpeedConfig(zero_stage=stage), total_steps=10))


@pytest.mark.slow
def test_deepspeed_bf16_trains_like_fp32(world1) -> None:
    """DeepSpeed gets bf16 enabled from the model's dtype (here on CPU too), so its ZeRO optimizer keeps
    fp32 masters: at lr 1e-6 the bf16 weights move as the rounding of fp32 training does."""
    pytest.importorskip("deepspeed")
    base = tiny_model(dtype=torch.bfloat16)
    start = _floats(base)
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        g = GspoConfig(engine="deepspeed", lr=1e-6, grad_accum=1)
        eng = build_engine(copy.deepcopy(base).to(dtype), g, DeepSpeedConfig(zero_stage=2), total_steps=10)
        assert eng.config["bf16"]["enabled"] is (dtype == torch.bfloat16)
        for i in range(10):
            eng.update([(2, lambda i=i, eng=eng: lm_loss(eng.module, i))])
        out[dtype] = _floats(eng.module)
    ref = {k: v.to(torch.bfloat16).float() for k, v in out[torch.float32].items()}
    n_ref = sum(int((ref[k] != start[k]).sum()) for k in start)
    n_got = sum(int((out[torch.bfloat16][k] != start[k]).sum()) for k in start)
    assert n_ref > 100 and abs(n_got - n_ref) <= 0.05 * n_ref, (n_got, n_ref)
