"""GSPO loss: parity with TRL's GRPOTrainer code path, GSPO-token ≡ GSPO, length invariance,
clipping and metrics, registry, memory-efficient token log-probs."""

from __future__ import annotations

import tempfile

import pytest
import torch

from components.errors import UserError
from components.gspo.logprobs import token_logprobs
from components.gspo.loss import (
    POLICY_LOSSES,
    GspoInputError,
    LossSettings,
    get_policy_loss,
    gspo_loss,
    register_policy_loss,
)

EPS_LOW, EPS_HIGH = 3e-4, 4e-4


def _batch(seed: int = 0, b: int = 4, t: int = 7, scale: float = 2e-3):
    """Log-probs near old ones (ratios straddle the tiny GSPO clip range), unequal lengths."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 3
    logp = (old + scale * torch.randn(b, t, generator=g)).requires_grad_(True)
    lengths = torch.tensor([t, 2, 5, 1][:b] + [t] * max(0, b - 4))
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0][:b] + [1.0] * max(0, b - 4))
    # garbage behind the mask must be ignored
    old = torch.where(mask.bool(), old, torch.full_like(old, 5.0))
    return logp, old, adv, mask


# ----------------------------------------------------------------------------- TRL parity

@pytest.fixture(scope="module")
def trl_trainer_factory():
    """Build real (tiny) TRL GRPOTrainers; only the log-prob forward is replaced by fixed values."""
    trl = pytest.importorskip("trl")
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["hello world a b c"] * 4,
                            trainers.BpeTrainer(vocab_size=40, special_tokens=["<unk>", "<pad>", "<eos>"]))
    ptok = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>",
                                   eos_token="<eos>")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(ptok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    model_dir = tempfile.mkdtemp()  # a path, so that beta > 0 can load TRL's reference model from it
    LlamaForCausalLM(cfg).save_pretrained(model_dir)

    def make(level: str, beta: float = 0.0):
        args = trl.GRPOConfig(output_dir=tempfile.mkdtemp(), report_to=[], use_cpu=True,
                              per_device_train_batch_size=2, num_generations=2, max_completion_length=8,
                              importance_sampling_level=level, loss_type="grpo", epsilon=EPS_LOW,
                              epsilon_high=EPS_HIGH, beta=beta, save_strategy="no",
                              # plain k3 KL (TRL's default multiplies it by the ratio)
                              use_bias_correction_kl=False)
        tr = trl.GRPOTrainer(model=model_dir, args=args, processing_class=ptok,
                             reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                             train_dataset=Dataset.from_dict({"prompt": ["hello world"] * 2}))
        tr.current_gradient_accumulation_steps = 1  # set by the training loop normally
        tr.model.train()
        return tr

    return make


def _trl_loss(trainer, logp, old, adv, mask, ref=None):
    """Run TRL's own ``_compute_loss`` on fixed per-token log-probs; returns (loss, metrics)."""
    calls = []

    def fixed_logps(model, input_ids, attention_mask, logits_to_keep, **kw):
        calls.append(logits_to_keep)
        return logp, torch.zeros_like(logp), None

    trainer._get_per_token_logps_and_entropies = fixed_logps
    b, t = logp.shape
    inputs = {"prompt_ids": torch.zeros(b, 1, dtype=torch.long),
              "prompt_mask": torch.ones(b, 1, dtype=torch.long),
              "completion_ids": torch.zeros(b, t, dtype=torch.long), "completion_mask": mask.long(),
              "advantages": adv, "old_per_token_logps": old}
    if ref is not None:
        inputs["ref_per_token_logps"] = ref
    trainer._metrics["train"].clear()
    loss = trainer._compute_loss(trainer.model, inputs)
    assert calls == [t], "TRL did not use the fixed log-probs"
    return loss, {k: v[-1] for k, v in trainer._metrics["train"].items()}


@pytest.mark.slow  # importing trl + transformers takes ~6-10 s on the shared 2-core box
@pytest.mark.parametrize("trl_level,ours", [("sequence", "sequence"), ("token", "token")])
@pytest.mark.parametrize("seed", [1, 2])
def test_parity_with_trl_grpo_trainer(trl_trainer_factory, trl_level, ours, seed):
    trainer = trl_trainer_factory(trl_level)
    logp, old, adv, mask = _batch(seed)
    loss_trl, m_trl = _trl_loss(trainer, logp, old, adv, mask)
    (g_trl,) = torch.autograd.grad(loss_trl, logp)
    out = gspo_loss(logp, old, adv, mask, LossSettings(eps_low=EPS_LOW, eps_high=EPS_HIGH, level=ours))
    (g_ours,) = torch.autograd.grad(out.loss, logp)
    torch.testing.assert_close(out.loss, loss_trl, atol=1e-7, rtol=1e-6)
    torch.testing.assert_close(g_ours, g_trl, atol=1e-7, rtol=1e-6)
    assert g_ours.abs().sum() > 0 and (g_ours * (1 - mask)).abs().sum() == 0
    # the batch must exercise clipping for the comparison to mean something
    assert m_trl["clip_ratio/low_mean"] + m_trl["clip_ratio/high_mean"] > 0
    assert out.metrics["gspo/clip_frac_low"] == pytest.approx(m_trl["clip_ratio/low_mean"], abs=1e-6)
    assert out.metrics["gspo/clip_frac_high"] == pytest.approx(m_trl["clip_ratio/high_mean"], abs=1e-6)


@pytest.mark.slow
def test_parity_with_trl_kl_term(trl_trainer_factory):
    trainer = trl_trainer_factory("sequence", beta=0.04)
    logp, old, adv, mask = _batch(3)
    ref = old - 0.05 * torch.rand_like(old)
    loss_trl, m_trl = _trl_loss(trainer, logp, old, adv, mask, ref=ref)
    out = gspo_loss(logp, old, adv, mask, LossSettings(eps_low=EPS_LOW, eps_high=EPS_HIGH, kl_beta=0.04), ref_logp=ref)
    torch.testing.assert_close(out.loss, loss_trl, atol=1e-7, rtol=1e-6)
    torch.testing.assert_close(torch.autograd.grad(out.loss, logp)[0], torch.autograd.grad(loss_trl, logp)[0],
                               atol=1e-7, rtol=1e-6)
    assert out.metrics["gspo/kl_ref"] == pytest.approx(m_trl["kl"], rel=1e-5)


# ----------------------------------------------------------------------------- GSPO-token ≡ GSPO

@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("adv_shape", ["B", "BT"])
def test_sequence_token_equals_sequence_for_constant_advantages(seed, adv_shape):
    logp, old, adv, mask = _batch(seed, b=6, t=9)
    out_s = gspo_loss(logp, old, adv, mask, LossSettings(level="sequence"))
    (g_s,) = torch.autograd.grad(out_s.loss, logp)
    adv_t = adv if adv_shape == "B" else adv[:, None].expand(-1, 9).clone()
    out_t = gspo_loss(logp, old, adv_t, mask, LossSettings(level="sequence_token"))
    (g_t,) = torch.autograd.grad(out_t.loss, logp)
    torch.testing.assert_close(out_t.loss, out_s.loss, atol=1e-6, rtol=0)
    torch.testing.assert_close(g_t, g_s, atol=1e-6, rtol=0)
    assert out_t.metrics == pytest.approx(out_s.metrics)
    # and it differs from the token-level ratio (so the test can tell the levels apart)
    (g_tok,) = torch.autograd.grad(gspo_loss(logp, old, adv, mask, LossSettings(level="token")).loss, logp)
    assert not torch.allclose(g_tok, g_s, atol=1e-6)


def test_sequence_token_uses_per_token_advantages():
    logp, old, adv, mask = _batch(0)
    adv_t = adv[:, None].expand(-1, logp.shape[1]).clone()
    adv_t[0, 0] += 1.0
    a = gspo_loss(logp, old, adv, mask, LossSettings(level="sequence_token")).loss
    b = gspo_loss(logp, old, adv_t, mask, LossSettings(level="sequence_token")).loss
    assert not torch.isclose(a, b)


# ----------------------------------------------------------------------------- aggregation

@pytest.mark.parametrize("level", ["sequence", "sequence_token", "token"])
def test_duplicating_tokens_does_not_change_sequence_weight(level):
    g = torch.Generator().manual_seed(7)
    old = -torch.rand(2, 4, generator=g)
    logp = old + 1e-3 * torch.randn(2, 4, generator=g)
    adv = torch.tensor([1.0, -0.5])
    mask = torch.ones(2, 4)
    # row 1 duplicated: its 4 tokens repeated to 8; row 0 padded to 8
    logp2, old2 = torch.zeros(2, 8), torch.zeros(2, 8)
    logp2[0, :4], old2[0, :4] = logp[0], old[0]
    logp2[1], old2[1] = logp[1].repeat(2), old[1].repeat(2)
    mask2 = torch.tensor([[1.0] * 4 + [0.0] * 4, [1.0] * 8])
    base = gspo_loss(logp, old, adv, mask, LossSettings(level=level, eps_low=0.2, eps_high=0.2)).loss
    dup = gspo_loss(logp2, old2, adv, mask2, LossSettings(level=level, eps_low=0.2, eps_high=0.2)).loss
    torch.testing.assert_close(dup, base, atol=1e-7, rtol=1e-6)
    # a token-weighted aggregation (the length-bias bug) would have moved the loss
    ratio = torch.exp(logp - old)
    token_weighted = -(torch.cat([ratio[0] * adv[0], (ratio[1] * adv[1]).repeat(2)])).mean()
    assert not torch.isclose(token_weighted, base, atol=1e-4)


def test_empty_rows_and_padding_garbage():
    logp, old, adv, mask = _batch(0)
    with torch.no_grad():
        logp[mask == 0] = -float("inf")
    base = gspo_loss(logp, old, adv, mask)
    (g,) = torch.autograd.grad(base.loss, logp)
    assert torch.isfinite(base.loss) and torch.isfinite(g).all()
    # an all-padding row is left out of the mean over sequences
    lp5 = torch.cat([logp.detach(), torch.zeros(1, 7)]).requires_grad_(True)
    out = gspo_loss(lp5, torch.cat([old, torch.zeros(1, 7)]), torch.cat([adv, torch.ones(1)]),
                    torch.cat([mask, torch.zeros(1, 7)]))
    torch.testing.assert_close(out.loss, base.loss)
    empty = gspo_loss(lp5[4:], torch.zeros(1, 7), torch.ones(1), torch.zeros(1, 7))
    assert empty.loss.item() == 0.0 and empty.loss.requires_grad


# ----------------------------------------------------------------------------- clipping

def _seq_with_ratio(ratios: list[float], t: int = 3):
    old = torch.full((len(ratios), t), -1.0)
    logp = (old + torch.log(torch.tensor(ratios))[:, None]).requires_grad_(True)
    return logp, old, torch.ones(len(ratios), t)


@pytest.mark.parametrize("level", ["sequence", "sequence_token", "token"])
def test_clipping_zeroes_gradient_on_the_active_side(level):
    #          high&A>0  high&A<0  low&A<0  low&A>0  inside
    ratios = [1.01, 1.01, 0.99, 0.99, 1.0001]
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0])
    logp, old, mask = _seq_with_ratio(ratios)
    out = gspo_loss(logp, old, adv, mask, LossSettings(level=level))
    (g,) = torch.autograd.grad(out.loss, logp)
    per_row = g.abs().sum(-1)
    assert per_row[0] == 0 and per_row[2] == 0  # clipped: no gradient
    assert per_row[1] > 0 and per_row[3] > 0 and per_row[4] > 0  # clip inactive: gradient flows
    # unclipped rows: d(-ρA)/dlogp_t = -ρA/|y| (sequence) or -ρA/|y| (token, per token), sum = -ρA
    torch.testing.assert_close(g.sum(-1)[[1, 3, 4]] * 5,
                               -torch.tensor(ratios)[[1, 3, 4]] * adv[[1, 3, 4]], rtol=1e-5, atol=1e-6)
    assert out.metrics["gspo/clip_frac_high"] == pytest.approx(1 / 5)
    assert out.metrics["gspo/clip_frac_low"] == pytest.approx(1 / 5)
    assert out.metrics["gspo/ratio_mean"] == pytest.approx(sum(ratios) / 5, rel=1e-5)


def test_clip_fraction_counts_tokens_at_token_level():
    old = torch.zeros(2, 4)
    logp = torch.tensor([[0.1, 0.0, 0.0, 0.0], [0.0, -0.1, -0.1, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    tok = gspo_loss(logp, old, torch.tensor([1.0, -1.0]), mask, LossSettings(level="token")).metrics
    assert tok["gspo/clip_frac_high"] == pytest.approx(1 / 7)
    assert tok["gspo/clip_frac_low"] == pytest.approx(2 / 7)
    seq = gspo_loss(logp, old, torch.tensor([1.0, -1.0]), mask, LossSettings(level="sequence")).metrics
    assert seq["gspo/clip_frac_high"] == pytest.approx(1 / 2)
    assert seq["gspo/clip_frac_low"] == pytest.approx(1 / 2)
    # approx_kl: k3 of KL(old‖θ) over valid tokens
    lr = torch.tensor([0.1, -0.1, -0.1])
    assert tok["gspo/approx_kl"] == pytest.approx(float((torch.exp(lr) - 1 - lr).sum() / 7), rel=1e-5)


def test_on_policy_ratio_is_one_and_gradient_is_policy_gradient():
    logp, _, adv, mask = _batch(0)
    out = gspo_loss(logp, logp.detach(), adv, mask)
    assert out.metrics["gspo/ratio_mean"] == pytest.approx(1.0)
    assert out.metrics["gspo/clip_frac_low"] == 0 and out.metrics["gspo/approx_kl"] == 0
    (g,) = torch.autograd.grad(out.loss, logp)
    lengths = mask.sum(-1, keepdim=True)
    torch.testing.assert_close(g, -adv[:, None] * mask / lengths / 4)


# ----------------------------------------------------------------------------- registry & errors

def test_registry():
    assert set(POLICY_LOSSES) >= {"sequence", "sequence_token", "token"}
    logp, old, adv, mask = _batch(0)
    for name in ("sequence", "sequence_token", "token"):
        a = get_policy_loss(name)(logp, old, adv, mask, LossSettings(eps_low=0.1, eps_high=0.1)).loss
        b = gspo_loss(logp, old, adv, mask, LossSettings(level=name, eps_low=0.1, eps_high=0.1)).loss
        assert torch.equal(a, b)
    with pytest.raises(UserError, match="nope"):
        get_policy_loss("nope")

    @register_policy_loss("_test_custom")
    def custom(logp, old_logp, advantages, mask, **kw):
        return gspo_loss(logp, old_logp, advantages, mask, **kw)

    try:
        assert get_policy_loss("_test_custom") is custom
        with pytest.raises(ValueError):
            register_policy_loss("_test_custom")(lambda *a, **k: None)
    finally:
        POLICY_LOSSES.pop("_test_custom")


@pytest.mark.parametrize("bad", ["old_shape", "adv_bt_seq", "adv_len", "mask_weights", "level", "kl_no_ref"])
def test_bad_input_raises_user_error(bad):
    logp, old, adv, mask = _batch(0)
    kw: dict = {}
    if bad == "old_shape":
        old = old[:, :3]
    elif bad == "adv_bt_seq":
        adv = adv[:, None].expand_as(logp)
    elif bad == "adv_len":
        adv = adv[:2]
    elif bad == "mask_weights":
        mask = mask * 0.5
    elif bad == "level":
        kw["level"] = "seq"
    else:
        kw["kl_beta"] = 0.1
    with pytest.raises(GspoInputError):
        gspo_loss(logp, old, adv, mask, LossSettings(**kw))


# ----------------------------------------------------------------------------- token_logprobs

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_logprobs_matches_log_softmax(dtype):
    g = torch.Generator().manual_seed(0)
    full = (4 * torch.randn(3, 6, 37, generator=g)).to(dtype).requires_grad_(True)
    logits = full[:, :-1]  # a non-contiguous view, as a trainer slices the last position off
    labels = torch.randint(0, 37, (3, 5), generator=g)
    labels[2, 3:] = -100
    got = token_logprobs(logits, labels, chunk_rows=2)  # several chunks per row, a ragged last one
    ref = torch.log_softmax(logits.float(), -1).gather(-1, labels.clamp(min=0)[..., None]).squeeze(-1)
    ref = ref.masked_fill(labels == -100, 0.0)
    assert got.dtype == torch.float32 and got.shape == (3, 5)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    w = torch.randn(3, 5, generator=g)
    (g_got,) = torch.autograd.grad((got * w).sum(), full)
    (g_ref,) = torch.autograd.grad((ref * w).sum(), full)
    assert g_got.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(g_got.float(), g_ref.float(), atol=tol, rtol=tol)
    assert g_got[2, 3:].abs().sum() == 0 and g_got[:, -1].abs().sum() == 0


def test_token_logprobs_gradcheck_and_errors():
    logits = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([[0, 5, 2], [1, -100, 4]])
    assert torch.autograd.gradcheck(lambda x: token_logprobs(x, labels, chunk_rows=2), (logits,))
    with pytest.raises(GspoInputError):
        token_logprobs(logits, labels[:, :2])
    with pytest.raises(GspoInputError):
        token_logprobs(logits, torch.full((2, 3), 6))
    with pytest.raises(GspoInputError):
        token_logprobs(logits, labels.float())


def test_logprobs_at_temperature_and_two_labels_gradcheck():
    """K labels per position share one log-sum-exp; the temperature divides float32 logits."""
    from components.gspo.logprobs import logprobs_at

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 4, 9, dtype=torch.float64, generator=g, requires_grad=True)
    pos_b, pos_t = torch.tensor([0, 0, 2, 1]), torch.tensor([1, 3, 0, 2])
    labels = torch.tensor([[2, 8], [0, 8], [5, 8], [8, 8]])
    got = logprobs_at(logits, pos_b, pos_t, labels, temperature=0.6, chunk_rows=3)
    ref = torch.log_softmax(logits[pos_b, pos_t] / 0.6, -1).gather(-1, labels)
    torch.testing.assert_close(got, ref)
    assert torch.autograd.gradcheck(
        lambda x: logprobs_at(x, pos_b, pos_t, labels, temperature=0.6, chunk_rows=3), (logits,))


def test_token_logprobs_chunks_across_rows_and_skips_ignored_positions(monkeypatch):
    """64 rows x 4 positions, half of them ignored: 128 positions in 100-position chunks are two
    log-sum-exp calls forward (not one per row), and the result still matches log_softmax."""
    calls = []
    real = torch.logsumexp
    monkeypatch.setattr(torch, "logsumexp", lambda *a, **k: calls.append(1) or real(*a, **k))
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(64, 4, 11, generator=g, requires_grad=True)
    labels = torch.randint(0, 11, (64, 4), generator=g)
    labels[:, 2:] = -100
    got = token_logprobs(logits, labels, chunk_rows=100)
    assert len(calls) == 2
    ref = torch.log_softmax(logits, -1).gather(-1, labels.clamp(min=0)[..., None]).squeeze(-1)
    torch.testing.assert_close(got, ref.masked_fill(labels == -100, 0.0))
    (grad,) = torch.autograd.grad(got.sum(), logits)
    (grad_ref,) = torch.autograd.grad(ref.masked_fill(labels == -100, 0.0).sum(), logits)
    torch.testing.assert_close(grad, grad_ref)
