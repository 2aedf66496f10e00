"""GSPO trainer: one step is exact about log-probs, metrics and state; packing is lossless."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.learning_env import ITEMS, make_run  # noqa: E402

from components.gspo.batching import pack_messages
from components.gspo.logprobs import Sampling, completion_logprobs
from components.gspo.step_batch import episode_row
from components.gspo.trainer import QuestionSampler

pytestmark = pytest.mark.usefixtures("one_thread")


def test_sampler_is_deterministic_and_resumable():
    a = QuestionSampler(ITEMS, seed=3)
    first = [x.id for x in a.next_batch(20)]
    b = QuestionSampler(ITEMS, seed=3)
    b.next_batch(7)
    c = QuestionSampler(ITEMS, seed=3, cursor=b.cursor)
    assert [x.id for x in c.next_batch(13)] == first[7:]
    assert sorted(first[:16]) == sorted(x.id for x in ITEMS)  # one epoch = a permutation


def test_recomputed_logprobs_equal_behaviour_logprobs():
    """π_old recomputed from packed (left-aligned prompt + completion, right-padded) rows equals the
    log-probs the rollout engine recorded while sampling: packing and position ids are exact."""
    run = make_run(["mas.temperature=0.7"], task="helper")
    episodes = run.task.play(ITEMS[:3], 2, seed=5)
    messages = [m for ep in episodes for m in ep.messages]
    batch = pack_messages(messages, pad_id=run.trainer.pad_id)
    with torch.no_grad():
        logp = completion_logprobs(run.trainer.engine.module, batch, Sampling(temperature=0.7,
                                                                              silence_id=run.trainer.silence_id))
    behaviour = torch.zeros_like(logp)
    for row, m in enumerate(messages):
        behaviour[row, : m.completion_tokens] = torch.tensor(m.logprobs)
    diff = ((logp - behaviour) * batch.completion_mask).abs().max().item()
    assert diff < 1e-4
    assert int(batch.completion_mask.sum()) == sum(m.completion_tokens for m in messages)
    for row, m in enumerate(messages):  # the packed ids are exactly the recorded ids
        n = m.completion_tokens
        assert batch.completion_ids[row, :n].tolist() == m.completion_ids


def test_train_step_metrics_and_state_round_trip():
    run = make_run(["gspo.minibatches=4", "gspo.grad_accum=2"], task="helper")
    before = [p.detach().clone() for p in run.trainer.engine.module.parameters()]
    res = run.trainer.train_step()
    after = list(run.trainer.engine.module.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    m = res.metrics
    for key in ("train/reward", "train/accuracy", "train/tokens_total", "train/tokens_completion",
                "train/tokens_communicated", "train/turns", "train/repetition", "train/silence_rate",
                "train/lambda_tok", "train/budget", "gspo/clip_frac_low", "gspo/clip_frac_high",
                "gspo/ratio_mean", "gspo/approx_kl", "gspo/grad_norm", "perf/rollout_tokens_per_s", "perf/step_s"):
        assert key in m and m[key] == m[key], key  # present and not NaN
    if Path("/proc/self/status").is_file():  # peak memory of each phase (a process holds > 10 MB)
        assert m["perf/rss_rollout_gb"] > 0.01 and m["perf/rss_update_gb"] > 0.01
    rows = [episode_row(ep, "completion") for ep in res.episodes]
    for name in rows[0]:  # every logged episode metric is the mean over the step's episodes
        assert m[f"train/{name}"] == pytest.approx(sum(r[name] for r in rows) / len(rows)), name
    state = run.trainer.state()
    other = make_run(["gspo.minibatches=4", "gspo.grad_accum=2"], task="helper")
    other.trainer.load_state(state)
    assert other.trainer.sampler.cursor == run.trainer.sampler.cursor
    assert other.trainer.controller.state_dict() == run.trainer.controller.state_dict()


def test_pi_old_is_scored_on_the_update_micro_batches_and_only_for_later_minibatches(monkeypatch):
    """The first mini-batch's own forward is π_old (no update has happened yet); the no-grad pass
    scores exactly the micro-batches of mini-batches 2..μ, row for row and shape for shape as the
    updates will (forwards of other shapes round differently in bf16), and with μ = 1 there is none."""
    import components.gspo.trainer as trainer_mod

    for minibatches, accum in ((4, 2), (1, 1)):
        run = make_run([f"gspo.minibatches={minibatches}", f"gspo.grad_accum={accum}", "gspo.log_kl_base=false"],
                       task="helper")
        calls: list[tuple[tuple[int, ...], list[int], bool]] = []
        real = trainer_mod.completion_logprobs

        def spy(model, batch, *args, _real=real, _calls=calls, **kwargs):
            _calls.append((tuple(batch.input_ids.shape), batch.input_ids[:, 0].tolist(), torch.is_grad_enabled()))
            return _real(model, batch, *args, **kwargs)

        monkeypatch.setattr(trainer_mod, "completion_logprobs", spy)
        res = run.trainer.train_step()
        rows = sum(len(ep.messages) for ep in res.episodes)
        no_grad = [c[:2] for c in calls if not c[2]]
        with_grad = [c[:2] for c in calls if c[2]]
        assert sum(shape[0] for shape, _ in with_grad) == rows and len(with_grad) == minibatches * accum
        assert no_grad == with_grad[accum:]  # same micro-batches, same shapes, same order
        if minibatches == 1:  # on-policy: every ratio is exactly 1, nothing is clipped
            assert res.metrics["gspo/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
            assert res.metrics["gspo/clip_frac_low"] + res.metrics["gspo/clip_frac_high"] == 0
        monkeypatch.undo()


def test_bf16_ratio_is_one_before_any_update_whatever_the_batch_shapes():
    """bf16, μ = 4 mini-batches of 2 micro-batches, weights held fixed: every mini-batch's GSPO ratio
    is 1 within 1e-6 and nothing is clipped. A GPU picks kernels (tiles, split-K) by shape, so bf16
    forwards of different batch shapes differ by more than ε = 3e-4; the CPU kernels here do not,
    so a logits perturbation of bf16 size seeded by the input shape stands in for that."""
    run = make_run(["gspo.minibatches=4", "gspo.grad_accum=2", "gspo.log_kl_base=false", "mas.temperature=0.7"],
                   task="helper", dtype=torch.bfloat16)
    model = run.trainer.engine.module
    assert next(model.parameters()).dtype == torch.bfloat16

    def shape_rounding(module, args, out):
        g = torch.Generator().manual_seed(hash(tuple(args[0].shape)) % 2**31)
        return out + (torch.randn(out.shape, generator=g) * 4e-3).to(out.dtype)

    model.lm_head.register_forward_hook(shape_rounding)
    metrics: list[dict[str, float]] = []
    loss_fn = run.trainer.loss_fn

    def recording_loss(*args, **kwargs):
        out = loss_fn(*args, **kwargs)
        metrics.append(out.metrics)
        return out

    run.trainer.loss_fn = recording_loss
    run.trainer.engine.update = lambda micro: [fn() for _, fn in micro] and 0.0  # losses, no step
    run.trainer.train_step()
    assert len(metrics) == 8
    for m in metrics:
        assert abs(m["gspo/ratio_mean"] - 1.0) < 1e-6, metrics
        assert m["gspo/clip_frac_low"] == m["gspo/clip_frac_high"] == 0.0


def test_kl_from_base_reuses_pi_old_and_costs_one_base_forward(monkeypatch):
    """``gspo/kl_base`` scores 16 messages of mini-batches 2..μ, whose π_old the step computed
    already: the only extra forward is the base model's, on those 16 rows. It is 0 before training
    has moved the policy and positive after."""
    import components.gspo.trainer as trainer_mod

    run = make_run(["gspo.minibatches=4", "gspo.grad_accum=1", "gspo.log_kl_base=true", "gspo.lr=0.05"],
                   task="helper")
    ref = run.trainer.ref_model
    assert ref is not None
    calls: list[tuple[bool, int, bool]] = []
    real = trainer_mod.completion_logprobs

    def spy(model, batch, *args, **kwargs):
        calls.append((model is ref, batch.input_ids.shape[0], torch.is_grad_enabled()))
        return real(model, batch, *args, **kwargs)

    monkeypatch.setattr(trainer_mod, "completion_logprobs", spy)
    first = run.trainer.train_step().metrics["gspo/kl_base"]
    assert [c for c in calls if c[0]] == [(True, 16, False)]
    policy_no_grad = [n for is_ref, n, grad in calls if not is_ref and not grad]
    assert len(policy_no_grad) == 3  # π_old of mini-batches 2..4, nothing for the KL
    assert 0.0 <= first < 1e-6
    assert run.trainer.train_step().metrics["gspo/kl_base"] > 1e-6
