"""Shared prompt heads in the training forwards: the same log-probs and the same parameter gradients
as the plain packed forward (fp32, both tiny architectures), with silence renormalisation and rows
that had to speak; the plain path under gradient checkpointing or when nothing is shared."""

from __future__ import annotations

import pytest
import torch

from components.gspo import shared_prompts
from components.gspo.batching import pack_messages
from components.gspo.logprobs import Sampling, completion_logprobs
from components.mas.records import Message
from components.models.tiny import build_tiny_model


def _msg(prompt: list[int], completion: list[int], silence_allowed: bool = True) -> Message:
    return Message(question_id="q", group_index=0, agent_id=0, role="solver", round=0, prompt_ids=prompt,
                   completion_ids=completion, logprobs=[0.0] * len(completion), silent=False, recipients=[],
                   silence_allowed=silence_allowed)


def _step_like_messages(seed: int = 0) -> list[Message]:
    """What a GSPO step holds: one system head for all, two tasks, identical first-round prompts
    (G episodes), later-round prompts that extend them, one unrelated prompt, uneven completions."""
    g = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(3, 400, (n,), generator=g).tolist()

    system, tasks = ids(40), [ids(25), ids(31)]
    msgs = []
    for k, task in enumerate(tasks):
        first = system + task
        for _ in range(3):  # G identical first-round prompts, different replies
            msgs.append(_msg(first, ids(int(torch.randint(1, 9, (1,), generator=g)))))
        msgs.append(_msg(first + ids(12 + k), ids(5)))  # a later round: the same head, then the transcript
        msgs.append(_msg(first + ids(3), [], silence_allowed=False))  # an empty reply
    msgs.append(_msg(ids(20), ids(6), silence_allowed=False))  # shares nothing with the others
    return msgs


def _score(model, batch, share: bool, banned: torch.Tensor) -> torch.Tensor:
    return completion_logprobs(model, batch, Sampling(temperature=0.7, silence_id=7, first_banned=banned),
                               share_prompts=share)


@pytest.fixture()
def shared_calls(monkeypatch) -> list[bool]:
    """Every call of the shared path, True where it ran (not None: it saved enough to share)."""
    calls: list[bool] = []
    real = shared_prompts.shared_head_logits

    def counted(*a, **k):
        out = real(*a, **k)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(shared_prompts, "shared_head_logits", counted)
    return calls


@pytest.mark.parametrize("arch", ["llama", "qwen2", "llama+lora"])
def test_shared_heads_give_the_plain_logprobs_and_gradients(arch: str, shared_calls: list[bool]) -> None:
    model, tok = build_tiny_model(0, arch=arch.split("+")[0])
    if arch.endswith("+lora"):  # peft names the cache argument past_key_values
        from components.models.lora import apply_lora

        model = apply_lora(model, rank=4, alpha=8)
    model.train()
    batch = pack_messages(_step_like_messages(), pad_id=int(tok.pad_token_id))
    banned = torch.zeros(len(tok), dtype=torch.bool)
    banned[[7, 2]] = True
    results = {}
    for share in (False, True):
        model.zero_grad()
        logp = _score(model, batch, share, banned)
        weights = torch.linspace(-1.0, 1.0, logp.numel()).reshape(logp.shape)  # a loss that weighs every id
        (logp * weights * batch.completion_mask).sum().backward()
        results[share] = (logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                          if p.requires_grad})
    assert shared_calls == [True], "the shared path did not run"
    torch.testing.assert_close(results[True][0], results[False][0], atol=2e-5, rtol=1e-5)
    assert results[True][0][batch.completion_mask == 0].abs().sum() == 0
    for name, grad in results[False][1].items():
        torch.testing.assert_close(results[True][1][name], grad, atol=2e-5, rtol=1e-4, msg=name)


def test_the_shared_path_runs_the_heads_once_then_each_rest() -> None:
    """The point of it: heads once, then each row's rest (rows with a one-id rest in their own call),
    not every row's whole prompt; the vocabulary projection on the scored positions only."""
    model, tok = build_tiny_model(0)
    batch = pack_messages(_step_like_messages(), pad_id=int(tok.pad_token_id))
    seen: list[tuple[int, ...]] = []
    hooks = [model.model.register_forward_pre_hook(lambda m, a, k: seen.append(tuple(k["input_ids"].shape)),
                                                   with_kwargs=True),
             model.lm_head.register_forward_pre_hook(lambda m, a: seen.append(tuple(a[0].shape)))]
    rows, t = (batch.completion_mask > 0).nonzero(as_tuple=True)
    with torch.no_grad():
        logits = shared_prompts.shared_head_logits(model, batch.input_ids, batch.prompt_lens, rows, t)
    for h in hooks:
        h.remove()
    assert logits is not None and logits.shape == (rows.shape[0], len(tok))
    heads, *rests, projected = seen
    assert heads[0] == 2  # one maximal head per task (system + task); the unrelated prompt has none
    assert len(rests) == 2 and sum(r[0] for r in rests) == 11  # short rests apart from the long ones
    one_call = 11 * (20 + 8)  # every rest padded to the longest (the unrelated prompt's 20 ids + C)
    assert sum(a * b for a, b in rests) < one_call
    assert projected == (rows.shape[0], 64)
    ran = sum(a * b for a, b in [heads, *rests])
    assert ran < 0.6 * batch.input_ids.numel(), (seen, batch.input_ids.shape)


def test_plain_forward_when_nothing_is_shared_or_under_gradient_checkpointing() -> None:
    model, tok = build_tiny_model(0)
    g = torch.Generator().manual_seed(3)
    unrelated = [_msg(torch.randint(3, 400, (30,), generator=g).tolist(), [5, 6]) for _ in range(4)]
    batch = pack_messages(unrelated, pad_id=int(tok.pad_token_id))
    rows, t = (batch.completion_mask > 0).nonzero(as_tuple=True)
    assert shared_prompts.shared_head_logits(model, batch.input_ids, batch.prompt_lens, rows, t) is None
    assert shared_prompts.can_share(model)
    model.config.final_logit_softcapping = 30.0  # logits the model post-processes: projected by the model only
    assert not shared_prompts.can_share(model)
    model.config.final_logit_softcapping = None
    model.activation_checkpointing_enable()
    assert not shared_prompts.can_share(model)
    batch = pack_messages(_step_like_messages(), pad_id=int(tok.pad_token_id))
    model.train()
    banned = torch.zeros(len(tok), dtype=torch.bool)
    banned[7] = True
    got = _score(model, batch, True, banned)  # the plain path: checkpointing drops use_cache
    model.activation_checkpointing_disable()
    torch.testing.assert_close(got, _score(model, batch, False, banned), atol=1e-6, rtol=0)


def test_a_training_step_with_shared_prompts_matches_the_plain_one(shared_calls: list[bool]) -> None:
    """``gspo.share_prompts`` reaches every training forward: one GSPO step (π_old, μ = 2 updates)
    with it on leaves the same weights as with it off (fp32, same seed), and the shared path ran.
    Tolerance 1e-4 against updates of 6e-3 (lr 3e-3): Adam turns a rounding-level difference in a
    near-zero gradient into ~1e-5 of update (measured: one element in each of two matrices)."""
    from helpers.learning_env import make_run

    weights, metrics = {}, {}
    for flag in (False, True):
        run = make_run([f"gspo.share_prompts={str(flag).lower()}", "reward.lambda_tok=0.5", "budget.enabled=false"],
                       seed=1)
        metrics[flag] = run.trainer.train_step().metrics
        weights[flag] = {n: p.detach().clone() for n, p in run.trainer.engine.module.named_parameters()}
    # the plain run never called it; the shared run used it in every forward
    assert shared_calls and all(shared_calls), shared_calls
    for key in ("gspo/loss", "gspo/grad_norm", "gspo/ratio_mean", "gspo/clip_frac_low", "gspo/clip_frac_high"):
        assert metrics[True][key] == pytest.approx(metrics[False][key], rel=1e-5, abs=1e-8), key
    for name, w in weights[False].items():
        torch.testing.assert_close(weights[True][name], w, atol=1e-4, rtol=0, msg=name)
