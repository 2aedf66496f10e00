"""Engines, LR schedules and distributed helpers (single process, CPU, tiny Llama)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import transformers

from components.config import DeepSpeedConfig, GspoConfig
from components.errors import UserError
from components.runtime.distributed import (
    DistributedError,
    all_gather_objects,
    all_reduce_mean,
    broadcast_object,
    dist_info,
    shard,
)
from components.runtime.engines import (
    EngineUsageError,
    TorchEngine,
    build_engine,
    deepspeed_config,
    write_deepspeed_config,
)
from components.runtime.schedule import LrSchedule, ScheduleError, build_scheduler

VOCAB = 64


def tiny_model(seed: int = 0) -> transformers.LlamaForCausalLM:
    """A 1-layer Llama (~15k params) with deterministic random weights."""
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=True)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg)


def lm_loss(model: torch.nn.Module, seed: int) -> torch.Tensor:
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(seed))  # [B=2, T=8]
    return model(input_ids=ids, labels=ids).loss


def test_torch_engine_step_changes_weights_and_returns_norm() -> None:
    model = tiny_model()
    before = copy.deepcopy(model.state_dict())
    eng = TorchEngine(model, GspoConfig(lr=1e-2, grad_clip=1.0), total_steps=10)
    eng.train()
    norm = eng.update([(2, lambda: lm_loss(eng.module, 0))])
    assert math.isfinite(norm) and norm > 0
    changed = [k for k, v in eng.module.state_dict().items() if not torch.equal(v, before[k])]
    assert "model.embed_tokens.weight" in changed and len(changed) >= 5
    assert eng.optimizer_steps == 1
    assert all(p.grad is None for p in eng.module.parameters())


def seq_loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Mean over rows of each row's mean token loss: the GSPO aggregation (per sequence, then over rows)."""
    logits = model(input_ids=ids).logits[:, :-1]  # [B, T-1, V]
    per_tok = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")  # [B, T-1]
    return per_tok.mean(-1).mean()


@pytest.mark.parametrize("split", [[1, 5], [3, 3], [2, 1, 3]])
def test_uneven_micro_batches_give_the_full_batch_update(split: list[int]) -> None:
    """Micro-batches weighted by their rows: any split of 6 rows updates like the whole 6 at once.
    (Dividing each micro-batch mean by the number of micro-batches instead gives the rows of a
    small micro-batch more weight: the [1, 5] split then fails this test.)"""
    ids = torch.randint(0, VOCAB, (6, 8), generator=torch.Generator().manual_seed(7))  # [B=6, T=8]
    a, b = tiny_model(), tiny_model()
    ea = TorchEngine(a, GspoConfig(lr=1e-2, grad_clip=100.0))
    eb = TorchEngine(b, GspoConfig(lr=1e-2, grad_clip=100.0))
    grads: dict[str, list[torch.Tensor]] = {"a": [], "b": []}
    for key, eng in (("a", ea), ("b", eb)):  # the gradient the optimizer sees (Adam's first step hides scale)
        step = eng.optimizer.step
        eng.optimizer.step = lambda *x, key=key, eng=eng, step=step: (
            grads[key].extend(p.grad.clone() for p in eng.module.parameters()), step(*x))[-1]
    parts = torch.split(ids, split)
    na = ea.update([(len(p), lambda p=p: seq_loss(a, p)) for p in parts])
    nb = eb.update([(6, lambda: seq_loss(b, ids))])
    assert na == pytest.approx(nb, rel=1e-5)
    for ga, gb in zip(grads["a"], grads["b"], strict=True):
        torch.testing.assert_close(ga, gb, rtol=1e-4, atol=1e-7)


def test_bad_updates_are_user_errors() -> None:
    eng = TorchEngine(tiny_model(), GspoConfig(lr=1e-3))
    with pytest.raises(EngineUsageError, match="at least one"):
        eng.update([])
    with pytest.raises(EngineUsageError, match=">= 1 row"):
        eng.update([(0, lambda: lm_loss(eng.module, 0))])
    with pytest.raises(EngineUsageError, match="scalar"):
        eng.update([(1, lambda: torch.ones(3, requires_grad=True))])


def test_clipping_bounds_the_update() -> None:
    eng = TorchEngine(tiny_model(), GspoConfig(lr=1e-3, grad_clip=1e-3))
    norm = eng.update([(1, lambda: lm_loss(eng.module, 0) * 1000)])
    assert norm > 1e-3  # returned norm is the pre-clipping one


def test_non_finite_gradient_skips_the_update() -> None:
    model = tiny_model()
    eng = TorchEngine(model, GspoConfig(lr=1e-2))
    before = copy.deepcopy(model.state_dict())
    assert math.isnan(eng.update([(1, lambda: lm_loss(model, 0) * float("nan"))]))
    assert eng.skipped_steps == 1 and eng.optimizer_steps == 0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_lr_property_follows_warmup() -> None:
    eng = TorchEngine(tiny_model(), GspoConfig(lr=1.0, lr_schedule="linear", warmup_steps=2), total_steps=6)
    lrs = []
    for i in range(6):
        lrs.append(eng.lr)
        eng.update([(1, lambda i=i: lm_loss(eng.module, i))])
    assert lrs == pytest.approx([1 / 3, 2 / 3, 1.0, 0.75, 0.5, 0.25])


@pytest.mark.parametrize("kind,expected", [
    ("constant", [0.5, 1.0, 1.0, 1.0, 1.0]),
    ("linear", [0.5, 1.0, 2 / 3, 1 / 3, 0.0]),
    ("cosine", [0.5, 1.0, 0.75, 0.25, 0.0]),
])
def test_schedules(kind: str, expected: list[float]) -> None:
    sched = LrSchedule(kind, warmup_steps=1, total_steps=4)
    assert [sched(s) for s in range(5)] == pytest.approx(expected)


def test_schedule_state_survives_state_dict_round_trip() -> None:
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    s1 = build_scheduler(opt, "cosine", 3, 20)
    for _ in range(5):
        opt.step()
        s1.step()
    opt2 = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    s2 = build_scheduler(opt2, "constant", 0, 1)
    s2.load_state_dict(s1.state_dict())
    assert s2.lr_lambdas[0].kind == "cosine"
    assert s2.get_last_lr() == s1.get_last_lr()


def test_bad_schedule_is_user_error() -> None:
    with pytest.raises(ScheduleError, match="allowed: constant, cosine, linear"):
        LrSchedule("step", 0, 10)
    with pytest.raises(UserError, match="total optimizer steps"):
        LrSchedule("constant", 0, 0)


@pytest.mark.parametrize("engine", ["torch", "deepspeed"])
def test_lr_min_ratio_floors_the_decay_in_both_engines(engine: str) -> None:
    """``gspo.lr_min_ratio`` reaches the scheduler of either engine: cosine over 4 updates, floor 0.3."""
    g = GspoConfig(engine=engine, lr=1e-2, lr_schedule="cosine", lr_min_ratio=0.3)
    eng = build_engine(tiny_model(), g, DeepSpeedConfig(zero_stage=0), total_steps=4)
    lrs = []
    for i in range(5):
        lrs.append(eng.lr)
        eng.update([(1, lambda i=i: lm_loss(eng.module, i))])
    cosine = [0.5 * (1 + math.cos(math.pi * s / 4)) for s in range(5)]  # 1, 0.85, 0.5, 0.15, 0
    assert lrs == pytest.approx([1e-2 * max(0.3, c) for c in cosine])
    assert lrs[-2:] == pytest.approx([0.3e-2, 0.3e-2])


def test_lr_min_ratio_is_validated() -> None:
    with pytest.raises(ValueError, match=r"(?s)lr_min_ratio.*less than or equal to 1"):
        GspoConfig(lr_min_ratio=1.5)
    with pytest.raises(ScheduleError, match="min_ratio"):
        LrSchedule("cosine", 0, 4, min_ratio=-0.1)


def test_deepspeed_config_from_cfg(tmp_path) -> None:
    g = GspoConfig(grad_accum=4, grad_clip=0.5)
    conf = deepspeed_config(g, DeepSpeedConfig(zero_stage=3), world_size=2, on_gpu=False)
    assert conf["zero_optimization"]["stage"] == 3
    assert conf["gradient_accumulation_steps"] == 1 and conf["managed_gradient_accumulation"] is False
    assert conf["train_batch_size"] == 2 * conf["train_micro_batch_size_per_gpu"]
    assert conf["gradient_clipping"] == 0.5 and conf["bf16"]["enabled"] is False
    assert "optimizer" not in conf  # the torch AdamW is passed in, no DeepSpeed op
    path = write_deepspeed_config(tmp_path / "ds.json", g, DeepSpeedConfig(zero_stage=2), 1, False)
    assert '"stage": 2' in path.read_text()


def test_build_engine_torch_and_total_steps_check() -> None:
    g = GspoConfig(engine="torch", lr=1e-3, lr_schedule="cosine", warmup_steps=1)
    eng = build_engine(tiny_model(), g, DeepSpeedConfig(), total_steps=8)
    assert isinstance(eng, TorchEngine) and eng.lr == pytest.approx(1e-3 / 2)
    with pytest.raises(EngineUsageError, match="total_steps"):
        build_engine(tiny_model(), g, DeepSpeedConfig(), total_steps=0)


@pytest.mark.parametrize("strategy", ["contiguous", "strided"])
def test_shard_partitions(strategy: str) -> None:
    items = list(range(11))
    parts = [shard(items, r, 3, strategy) for r in range(3)]
    assert sorted(x for p in parts for x in p) == items
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    if strategy == "contiguous":
        assert parts == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]
    else:
        assert parts[1] == [1, 4, 7, 10]


def test_shard_rejects_bad_rank() -> None:
    with pytest.raises(DistributedError, match="rank=3"):
        shard([1, 2], 3, 3)
    with pytest.raises(DistributedError, match="world=0"):
        shard([1, 2], 0, 0)


def test_collectives_without_process_group() -> None:
    assert all_gather_objects({"a": 1}) == [{"a": 1}]
    assert broadcast_object([1, 2]) == [1, 2]
    assert all_reduce_mean(2.5) == 2.5
    info = dist_info()
    assert info.world_size >= 1 and info.is_main == (info.rank == 0)


def test_init_distributed_sets_env_defaults_without_group(monkeypatch) -> None:
    from components.runtime.distributed import init_distributed, is_distributed

    if is_distributed():
        pytest.skip("a process group is already live in this test process")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    info = init_distributed()
    assert (info.rank, info.world_size, info.local_rank, info.is_main) == (0, 1, 0, True)
    import os

    assert os.environ["MASTER_ADDR"] == "127.0.0.1" and int(os.environ["MASTER_PORT"]) > 0
    assert not is_distributed()  # world 1 with the torch engine needs no process group
    assert str(info.device) in ("cpu", "cuda:0")


def test_init_distributed_rejects_inconsistent_launcher_env(monkeypatch) -> None:
    from components.runtime.distributed import init_distributed

    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(DistributedError, match="RANK=3 / WORLD_SIZE=2"):
        init_distributed()
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(DistributedError, match="RANK='x'"):
        init_distributed()


def test_shutdown_destroys_a_gloo_group_and_lets_other_threads_run(monkeypatch) -> None:
    """After a gloo collective, shutdown hands the GIL to other threads before returning.

    Gloo worker threads free the last collective's tensors after ``wait()`` returned and need the
    GIL for it; if the interpreter finalises first the process aborts (see ``_drain_gloo_workers``).
    Here a Python thread stands in for them: it must make progress while shutdown runs.
    """
    import threading
    import time

    import torch.distributed as dist

    from components.runtime.distributed import GLOO_DRAIN_S, free_port, is_distributed, shutdown_distributed

    if is_distributed():
        pytest.skip("a process group is already live in this test process")
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, value)
    dist.init_process_group("gloo")
    assert all_gather_objects(list(range(100))) == [list(range(100))]
    ticks, stop = [0], threading.Event()

    def spin() -> None:
        while not stop.is_set():
            ticks[0] += 1

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    time.sleep(0.01)
    before, t0 = ticks[0], time.perf_counter()
    shutdown_distributed()
    elapsed, during = time.perf_counter() - t0, ticks[0] - before
    stop.set()
    spinner.join()
    assert not is_distributed()
    assert elapsed >= GLOO_DRAIN_S and during > 1000
    shutdown_distributed()  # a second call is a no-op


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_training_job_schedule_ends_at_the_last_update(tmp_path, monkeypatch, kind: str) -> None:
    """The job steps the LR schedule once per mini-batch; the schedule must span steps x minibatches
    updates: still > 0 at the last update and 0 only after it (not after steps updates, 1/μ of the run)."""
    from helpers.learning_env import ITEMS

    from components.config import load_config
    from components.runtime.engines import TorchEngine
    from components.runtime.training_run import train

    before: list[float] = []
    after: list[float] = []
    real_step = TorchEngine._step

    def spy(self: TorchEngine) -> float:
        before.append(self.lr)
        norm = real_step(self)
        after.append(self.lr)
        return norm

    monkeypatch.setattr(TorchEngine, "_step", spy)
    cfg = load_config(overrides=[
        "model.name=tiny-random", "gspo.engine=torch", "gspo.steps=3", "gspo.minibatches=2", "gspo.lr=1e-3",
        f"gspo.lr_schedule={kind}", "gspo.questions_per_step=2", "gspo.group_size=2", "mas.agents=2",
        "mas.rounds=1", "mas.max_message_tokens=4", "gspo.checkpoint_every=100", "tracking.log_model=false"])
    train(cfg, items=ITEMS, out_dir=tmp_path, track=False)
    assert len(before) == 3 * 2  # one update per mini-batch
    assert before == pytest.approx([LrSchedule(kind, 0, 6)(i) * 1e-3 for i in range(6)])
    assert before[-1] > 0 and after[-1] == pytest.approx(0.0, abs=1e-12)


def test_training_job_enables_activation_checkpointing_without_deprecation_warnings(tmp_path) -> None:
    """model.gradient_checkpointing: the job turns it on through the current transformers API (the
    old name raises a FutureWarning since 5.24), and a step still trains."""
    import warnings

    from helpers.learning_env import ITEMS
    from transformers import PreTrainedModel

    from components.config import load_config
    from components.runtime.training_run import train

    seen: list[bool] = []
    real = PreTrainedModel.activation_checkpointing_enable

    def spy(self: PreTrainedModel, *args, **kwargs) -> None:
        real(self, *args, **kwargs)
        seen.append(self.is_activation_checkpointing)

    cfg = load_config(overrides=[
        "model.name=tiny-random", "model.gradient_checkpointing=true", "gspo.engine=torch", "gspo.steps=1",
        "gspo.questions_per_step=1", "gspo.group_size=2", "mas.agents=2", "mas.rounds=1", "mas.max_message_tokens=4",
        "gspo.checkpoint_every=100", "tracking.log_model=false"])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*gradient_checkpointing.*", category=FutureWarning)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(PreTrainedModel, "activation_checkpointing_enable", spy)
            result = train(cfg, items=ITEMS, out_dir=tmp_path, track=False)
    assert seen == [True] and len(result.history) == 1


def test_unlink_deepspeed_shm_buffer_removes_only_this_runs_rank(tmp_path, monkeypatch) -> None:
    """The name is DeepSpeed's (uid, MASTER_ADDR, MASTER_PORT, rank): another run's or rank's buffer stays."""
    import os

    from components.runtime import shm_buffers as d

    monkeypatch.setattr(d, "SHM_DIR", str(tmp_path))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29611")
    mine = tmp_path / f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_29611_1"
    others = [tmp_path / f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_29611_0",
              tmp_path / f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_29612_1"]
    for f in (mine, *others):
        f.write_bytes(b"x")
    assert d.deepspeed_shm_buffer(1) == str(mine)
    assert d.unlink_deepspeed_shm_buffer(1) is True and not mine.exists()
    assert all(f.exists() for f in others)
    assert d.unlink_deepspeed_shm_buffer(1) is False  # already gone: not an error

