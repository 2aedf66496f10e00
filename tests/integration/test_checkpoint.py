"""Atomic checkpoints: save/load round trips, retention, crash safety, bit-exact resume."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from components.config import DeepSpeedConfig, GspoConfig
from components.runtime.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    read_meta,
    save_checkpoint,
)
from components.runtime.engines import TorchEngine, TrainEngine, build_engine

VOCAB = 64


def tiny_model(seed: int) -> transformers.LlamaForCausalLM:
    """1-layer Llama with attention dropout, so the forward pass consumes the torch RNG."""
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   attention_dropout=0.1, tie_word_embeddings=False)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg)


def train(engine: TrainEngine, steps: int) -> list[float]:
    """``steps`` updates on batches drawn from the global RNGs (torch, numpy, python)."""
    engine.train()
    norms = []
    for _ in range(steps):
        micro = []
        for _ in range(2):
            ids = torch.randint(0, VOCAB, (2, 8))  # [B, T]
            scale = 1.0 + float(np.random.rand()) + random.random()
            micro.append((2, lambda ids=ids, scale=scale: engine.module(input_ids=ids, labels=ids).loss * scale))
        norms.append(engine.update(micro))
    return norms


def weights(engine: TrainEngine) -> dict[str, torch.Tensor]:
    """Full weights (gathered under ZeRO-3, where parameters are otherwise empty partitions)."""
    with engine.gathered_parameters():
        out = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
    assert all(v.numel() > 0 for v in out.values())
    return out


def torch_engine(seed: int = 0, **kw) -> TorchEngine:
    return TorchEngine(tiny_model(seed), GspoConfig(lr=1e-2, grad_clip=1.0, lr_schedule="cosine", warmup_steps=1),
                       total_steps=10, **kw)


def test_save_load_restores_weights_optimizer_scheduler_rng(tmp_path: Path) -> None:
    torch.manual_seed(1)
    eng = torch_engine()
    train(eng, 3)
    extra = {"cursor": 17, "controller": {"lambda_tok": 0.25}, "history": [{"train/reward": 0.5}]}
    path = save_checkpoint(tmp_path, 3, eng, extra=extra)
    assert path == tmp_path / "checkpoints" / "step-000003"
    expect_next = torch.rand(4)
    expect_np, expect_py = np.random.rand(), random.random()
    saved_w, saved_opt, lr = weights(eng), eng.optimizer.state_dict(), eng.lr

    torch.manual_seed(123)  # fresh state: different init and RNG
    np.random.seed(5)
    fresh = torch_engine(seed=7)
    got_extra = load_checkpoint(path, fresh)
    assert got_extra == extra
    assert torch.equal(torch.rand(4), expect_next)
    assert np.random.rand() == expect_np and random.random() == expect_py
    for k, v in weights(fresh).items():
        assert torch.equal(v, saved_w[k]), k
    opt = fresh.optimizer.state_dict()
    assert opt["state"].keys() == saved_opt["state"].keys()
    for i, st in saved_opt["state"].items():
        assert torch.equal(opt["state"][i]["exp_avg_sq"], st["exp_avg_sq"])
        assert float(opt["state"][i]["step"]) == 3.0
    assert fresh.lr == lr and fresh.optimizer_steps == 3
    assert read_meta(path).engine == "torch"


def test_model_folder_loads_with_from_pretrained(tmp_path: Path) -> None:
    eng = torch_engine()
    train(eng, 1)
    path = save_checkpoint(tmp_path, 1, eng, extra={})
    loaded = transformers.LlamaForCausalLM.from_pretrained(path / "model")
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, eng.module.state_dict()[k]), k


def test_non_json_extra_round_trips_by_pickle(tmp_path: Path) -> None:
    eng = torch_engine()
    extra = {"pair": (1, 2), 3: "int key"}
    path = save_checkpoint(tmp_path, 0, eng, extra=extra)
    assert read_meta(path).extra_format == "pickle" and (path / "extra.pkl").is_file()
    assert load_checkpoint(path, torch_engine()) == extra


def test_retention_keeps_last_k(tmp_path: Path) -> None:
    eng = torch_engine()
    for step in (1, 2, 3, 4, 5):
        save_checkpoint(tmp_path, step, eng, extra={"s": step}, keep=2)
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert names == ["step-000004", "step-000005"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == names
    assert latest_checkpoint(tmp_path).name == "step-000005"


def test_crash_mid_save_keeps_previous_and_is_never_latest(tmp_path: Path, monkeypatch) -> None:
    eng = torch_engine()
    train(eng, 1)
    good = save_checkpoint(tmp_path, 1, eng, extra={"ok": True}, keep=1)
    good_files = sorted(p.relative_to(good) for p in good.rglob("*"))
    train(eng, 1)

    def boom(folder: Path) -> None:
        (folder / "model").mkdir(parents=True, exist_ok=True)
        (folder / "model" / "half.bin").write_bytes(b"\0" * 10)
        raise OSError("disk full")

    monkeypatch.setattr(eng, "save_checkpoint_state", boom)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 2, eng, extra={"ok": False}, keep=1)
    assert latest_checkpoint(tmp_path) == good
    assert sorted(p.relative_to(good) for p in good.rglob("*")) == good_files
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-000001"]


def test_leftover_tmp_and_incomplete_folders_are_ignored(tmp_path: Path) -> None:
    eng = torch_engine()
    good = save_checkpoint(tmp_path, 4, eng, extra={})
    root = tmp_path / "checkpoints"
    (root / ".tmp-step-000009" / "model").mkdir(parents=True)  # killed mid-save (no cleanup ran)
    (root / "step-000008").mkdir()  # hand-made folder without meta.json
    assert latest_checkpoint(tmp_path) == good
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        load_checkpoint(root / "step-000008", torch_engine())
    assert latest_checkpoint(tmp_path / "nothing") is None


def test_engine_kind_mismatch_is_user_error(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, 0, torch_engine(), extra={})
    meta = json.loads((path / "meta.json").read_text())
    meta["engine"] = "deepspeed"
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="gspo.engine: deepspeed"):
        load_checkpoint(path, torch_engine())


def _resume_matches(tmp_path: Path, make, n: int = 5, k: int = 2) -> TrainEngine:
    """Train n steps straight vs k + save + fresh engine/RNG + load + (n - k); compare bit-for-bit."""
    torch.manual_seed(42)
    np.random.seed(42)
    random.seed(42)
    straight = make(0)
    norms_a = train(straight, n)
    w_a = weights(straight)

    torch.manual_seed(42)
    np.random.seed(42)
    random.seed(42)
    first = make(0)
    norms_b = train(first, k)
    path = save_checkpoint(tmp_path, k, first, extra={"cursor": k})
    del first
    torch.manual_seed(999)
    np.random.seed(999)
    random.seed(999)
    second = make(31)
    assert load_checkpoint(path, second) == {"cursor": k}
    norms_b += train(second, n - k)
    for key, v in weights(second).items():
        assert torch.equal(v, w_a[key]), key
    assert norms_a == norms_b and all(x > 0 for x in norms_a)
    return second


def test_resume_is_bit_exact_torch_engine(tmp_path: Path) -> None:
    cosine = GspoConfig(lr=1e-2, grad_clip=0.5, lr_schedule="cosine", warmup_steps=1)
    _resume_matches(tmp_path, lambda seed: TorchEngine(tiny_model(seed), cosine, total_steps=5))


@pytest.fixture()
def deepspeed_world1(monkeypatch):
    """Single-rank DeepSpeed process group on a free port; destroyed afterwards."""
    pytest.importorskip("deepspeed")
    from components.runtime.distributed import free_port, shutdown_distributed

    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, value)
    yield
    shutdown_distributed()


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_resume_is_bit_exact_deepspeed_zero(tmp_path: Path, deepspeed_world1, stage: int) -> None:
    g = GspoConfig(engine="deepspeed", lr=1e-2, grad_clip=0.5, lr_schedule="cosine", warmup_steps=1)
    ds = DeepSpeedConfig(zero_stage=stage)
    eng = _resume_matches(tmp_path, lambda seed: build_engine(tiny_model(seed), g, ds, total_steps=5))
    assert eng.kind == "deepspeed" and eng.optimizer_steps == 5
    final = save_checkpoint(tmp_path, 5, eng, extra={})
    assert (final / "engine" / "deepspeed" / "state").is_dir()
    hf = transformers.LlamaForCausalLM.from_pretrained(final / "model").state_dict()
    for key, v in weights(eng).items():  # model/ holds the full (gathered) weights at every stage
        assert torch.equal(hf[key], v), key


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 2])
def test_deepspeed_update_equals_torch_update_for_uneven_micro_batches(deepspeed_world1, stage: int) -> None:
    """DeepSpeed accumulates micro-batches of 1 and 3 rows like the torch engine (rows-weighted, one
    boundary per update), so both engines land on the same weights as one 4-row batch."""
    ids = torch.randint(0, VOCAB, (4, 8), generator=torch.Generator().manual_seed(3))  # [B=4, T=8]

    def loss(model: torch.nn.Module, rows: torch.Tensor) -> torch.Tensor:
        logits = model(input_ids=rows).logits[:, :-1]  # [b, T-1, V]
        tok = torch.nn.functional.cross_entropy(logits.transpose(1, 2), rows[:, 1:], reduction="none")
        return tok.mean(-1).mean()  # per sequence, then over rows

    g = GspoConfig(engine="deepspeed", lr=1e-2, grad_clip=100.0)
    ds = build_engine(tiny_model(0), g, DeepSpeedConfig(zero_stage=stage), total_steps=2)
    ref = TorchEngine(tiny_model(0), GspoConfig(lr=1e-2, grad_clip=100.0), total_steps=2)
    ds.eval()  # no attention dropout: both engines see the same forward
    ref.eval()
    parts = (ids[:1], ids[1:])
    norms = []
    for _ in range(3):  # the pre-clipping norm carries the gradient's scale; weights its direction (Adam)
        norms.append((ds.update([(len(p), lambda p=p: loss(ds.module, p)) for p in parts]),
                      ref.update([(4, lambda: loss(ref.module, ids))])))
    assert norms[0][0] == pytest.approx(norms[0][1], rel=1e-5)  # same weights, same batch: same gradient
    assert all(a == pytest.approx(b, rel=1e-3) for a, b in norms)
    got, want = weights(ds), weights(ref)
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, rtol=1e-3, atol=1e-4, msg=key)


def test_only_unparseable_files_are_called_corrupt(tmp_path):
    """A loader failing on the bytes is a corrupt file (one message naming it); a failure applying a
    state that read fine (an optimizer group that no longer fits, a bug) keeps its own error."""
    import pickle

    from components.runtime.checkpoint import CheckpointError, _reading

    f = tmp_path / "step-000001" / "engine" / "engine_state.pt"
    for exc in (EOFError("Ran out of input"), pickle.UnpicklingError("truncated"),
                RuntimeError("PytorchStreamReader failed reading zip archive: failed finding central directory")):
        with pytest.raises(CheckpointError, match=f"{f}: corrupt or unreadable checkpoint file"):
            with _reading(f, f.parent.parent):
                raise exc
    for exc in (ValueError("loaded state dict contains a parameter group that doesn't match the size of "
                           "optimizer's group"), RuntimeError("CUDA out of memory")):
        with pytest.raises(type(exc), match=str(exc)[:20]):
            with _reading(f, f.parent.parent):
                raise exc


def test_a_wrapped_write_error_on_a_full_device_is_reported_as_enospc(tmp_path: Path, monkeypatch) -> None:
    """torch.save / safetensors wrap ENOSPC in their own errors: with the device full the save
    raises OSError(ENOSPC) naming the checkpoint folder (the CLI's one line, exit 2); otherwise the
    writer's own error stays (a bug is not dressed up as a full disk)."""
    import errno

    import components.io as io

    eng = torch_engine()

    def wrapped(folder: Path) -> None:
        raise RuntimeError("[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file")

    monkeypatch.setattr(eng, "save_checkpoint_state", wrapped)
    monkeypatch.setattr(io, "_device_full", lambda path: True)
    with pytest.raises(OSError) as err:
        save_checkpoint(tmp_path, 1, eng, extra={})
    assert err.value.errno == errno.ENOSPC and err.value.filename.endswith(".tmp-step-000001")
    monkeypatch.setattr(io, "_device_full", lambda path: False)
    with pytest.raises(RuntimeError, match="PytorchStreamWriter"):
        save_checkpoint(tmp_path, 1, eng, extra={})
    assert not list((tmp_path / "checkpoints").iterdir())
