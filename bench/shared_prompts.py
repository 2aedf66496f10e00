"""GSPO update cost: prompt heads shared across a step's messages vs the plain packed forward.

One proof-profile step is rolled out once (``--questions`` split-information training questions x
``--group`` episodes, the packaged SmolLM2-135M-Instruct in the profile's dtype with its silence
prior, sampled at the profile's temperature); both sides then do the update phase's forwards on
exactly those messages and mini-batches, as the trainer does with ``gspo.kl_beta`` > 0: π_ref on
every mini-batch, π_old on mini-batches 2..μ (no gradients), then a forward and backward of the
policy's log-probs on every mini-batch. Ours: :func:`components.gspo.logprobs.completion_logprobs`
with shared heads (components/gspo/shared_prompts.py); peer: the same call with
``share_prompts=False``, every row's whole prompt. Each side runs ``--repeats`` times, alternating,
and its best time counts; the largest |Δ log-prob| between the sides is printed too (rounding only).

The untrained team talks in both rounds, so later-round prompts (which share only the frame with
the first round) are in the batch: a trained team, silent after one answer, shares more.

    python bench/shared_prompts.py [--questions 2] [--group 8] [--repeats 2]

Throughput = the step's completion tokens / the update phase's seconds. Ends with
``bench shared_prompts: ours <x> tokens/s, peer <y> tokens/s, ratio <r>x (target 2x)``; exits 0.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

if __package__ in (None, ""):  # `python bench/shared_prompts.py`: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ratio_line  # noqa: E402


def _update_phase(model, batch, parts, temperature: float, share: bool) -> tuple[float, torch.Tensor]:
    """Seconds for π_ref (all), π_old (parts 2..μ) and policy forward+backward (all); its log-probs."""
    from components.gspo.logprobs import Sampling, completion_logprobs

    def score(rows: torch.Tensor) -> torch.Tensor:
        return completion_logprobs(model, batch.select(rows), Sampling(temperature=temperature), share_prompts=share)

    logp = torch.zeros_like(batch.completion_mask)
    t0 = time.perf_counter()
    with torch.no_grad():
        for k, rows in enumerate(parts):
            score(rows)  # π_ref (the trainer scores the base weights: same cost)
            if k:
                score(rows)  # π_old
    for rows in parts:
        out = score(rows)
        (out * batch.completion_mask[rows]).sum().backward()
        logp[rows] = out.detach()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0, logp


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=2)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from components.config import load_config
    from components.data.train_items import load_train_items
    from components.gspo.batching import minibatch_indices, pack_messages
    from components.mas.engine import RolloutEngine
    from components.mas.environment import Environment
    from components.mas.prior import apply_silence_prior
    from components.models import PolicyInit, load_policy

    cfg = load_config(profile="proof")
    torch.manual_seed(args.seed)
    items = load_train_items(cfg)
    model, tok = load_policy(cfg.model.name, PolicyInit(seed=args.seed), cache_dir=cfg.model.cache_dir,
                             dtype=cfg.model.dtype, device="cpu", silence_marker=cfg.mas.silence_marker)
    apply_silence_prior(model, tok, cfg.mas, items, cfg.model.silence_prior, cfg.model.silence_calibration)
    env = Environment(RolloutEngine(model, tok, cfg.mas, device="cpu"))
    model.eval()
    with torch.no_grad():
        episodes = env.play(items[: args.questions], args.group, seed=args.seed)
    messages = [m for ep in episodes for m in ep.messages]
    batch = pack_messages(messages, pad_id=int(tok.pad_token_id))
    parts = minibatch_indices(len(messages), cfg.gspo.minibatches, torch.Generator().manual_seed(args.seed))
    n_prompt = sum(len(m.prompt_ids) for m in messages)
    n_completion = sum(len(m.completion_ids) for m in messages)
    print(f"{len(messages)} messages from {len(episodes)} episodes: {n_prompt} prompt ids, "
          f"{n_completion} completion ids; {len(parts)} mini-batches, model dtype {model.dtype}", flush=True)
    model.train()
    best = {True: float("inf"), False: float("inf")}
    logps = {}
    for rep in range(args.repeats):
        for share in (False, True):
            seconds, logps[share] = _update_phase(model, batch, parts, cfg.mas.temperature, share)
            best[share] = min(best[share], seconds)
            print(f"repeat {rep + 1}/{args.repeats} {'shared heads' if share else 'plain':>12}: {seconds:.2f} s",
                  flush=True)
    diff = float((logps[True] - logps[False]).abs().max())
    print(f"max |log-prob(shared) - log-prob(plain)| = {diff:.2e} ({model.dtype} rounding)")
    print(ratio_line("shared_prompts", n_completion / best[True], n_completion / best[False], "tokens/s", 2.0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
