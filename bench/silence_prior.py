"""How evenly the silence prior lands on prompts it was not fitted on: per_prompt vs mean_direction.

``model.silence_prior`` p is meant as the step-0 policy's probability of starting a reply with
silence. Both fits (``model.silence_calibration``, components/models/silence.py) set the silence
row from first-round prompts of training items; this bench applies each to a fresh copy of the
model of ``--profile`` (default ``results``: SmolLM2-135M-Instruct, bf16, T 0.5) and measures
P(silence first) at the sampling temperature on the first-round prompts of ``--items`` training
items that neither fit used. The figure compared is the share of those prompts whose probability
lies within a factor 2 of p (in [p/2, 2p]): a prompt far under p explores no silence, one far over
it starts out mostly silent. Ours is ``per_prompt``, the peer ``mean_direction`` (the earlier fit);
the mean, median, 10th and 90th percentile are printed per side and per benchmark.

    python bench/silence_prior.py                                        # GSM8K train (profile results)
    python bench/silence_prior.py --sources mmlu/val,aqua/dev
    python bench/silence_prior.py --model tiny-random --items 4           # a logic check, seconds

Needs prepared data (``agent-gspo prepare``; ``--data``). Ends with
``bench silence_prior: ours <x> share, peer <y> share, ratio <r>x (target 1.5x)``; exits 0.
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
from pathlib import Path

import torch

if __package__ in (None, ""):  # `python bench/silence_prior.py`: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ratio_line  # noqa: E402
from components.config import load_config  # noqa: E402
from components.data.train_items import load_train_items  # noqa: E402
from components.mas.engine import RolloutEngine  # noqa: E402
from components.mas.prior import apply_silence_prior, calibration_items  # noqa: E402
from components.models import PolicyInit, load_policy  # noqa: E402
from components.models.silence import first_token_states  # noqa: E402

TARGET = 1.5
METHODS = ("per_prompt", "mean_direction")


def _summary(p: torch.Tensor) -> str:
    q = torch.quantile(p, torch.tensor([0.5, 0.1, 0.9]))
    return f"mean {float(p.mean()):.3f} median {float(q[0]):.3f} p10 {float(q[1]):.3f} p90 {float(q[2]):.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="results")
    ap.add_argument("--sources", default="gsm8k/train", help="comma-separated benchmark/split training sources")
    ap.add_argument("--items", type=int, default=32, help="held-out training items measured (x agents prompts)")
    ap.add_argument("--model", default=None, help="model alias or folder (default: the profile's)")
    ap.add_argument("--data", default=None, help="prepared data folder (default data.out_dir)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    sources = [s.strip() for s in args.sources.split(",") if s.strip()]
    sets = [f"data.train_sources={sources!r}"] + ([f"model.name={args.model}"] if args.model else [])
    cfg = load_config("params.yaml", profile=args.profile, overrides=sets)
    prior = cfg.model.silence_prior or 0.1
    items = list(load_train_items(cfg, Path(args.data) if args.data else None))
    used = {it.id for m in METHODS for it in calibration_items(items, m)}
    rest = [it for it in items if it.id not in used]
    if len(rest) < args.items:
        raise SystemExit(f"bench silence_prior: only {len(rest)} training items left after calibration, "
                         f"need --items {args.items}")
    held = random.Random(7).sample(rest, args.items)
    base, tok = load_policy(cfg.model.name, PolicyInit(seed=0), cache_dir=cfg.model.cache_dir, dtype=cfg.model.dtype,
                            device=torch.device("cpu"), silence_marker=cfg.mas.silence_marker)
    temp = cfg.mas.temperature or 1.0
    print(f"profile {args.profile}, model {cfg.model.name}, sources {','.join(sources)}, prior {prior}, T {temp}, "
          f"{len(held)} held-out items", file=sys.stderr)
    share: dict[str, float] = {}
    for method in METHODS:
        model = copy.deepcopy(base)
        reached = apply_silence_prior(model, tok, cfg.mas, items, prior, method)
        engine = RolloutEngine(model, tok, cfg.mas)
        rows = [(it.benchmark, p) for it in held for p in engine.first_round_prompts([it])]
        _, logits = first_token_states(model, [p for _, p in rows])
        probs = torch.softmax(logits.float() / temp, dim=-1)[:, engine.silence_id]  # [n]
        share[method] = float(((probs >= prior / 2) & (probs <= 2 * prior)).float().mean())
        print(f"{method}: calibration prompts {reached:.3f}; held out ({len(rows)} prompts) {_summary(probs)}, "
              f"within [p/2, 2p] {share[method]:.2f}", file=sys.stderr)
        for bench in sorted({b for b, _ in rows}):
            sel = torch.tensor([b == bench for b, _ in rows])
            print(f"  {bench}: {_summary(probs[sel])}", file=sys.stderr)
    print(ratio_line("silence_prior", share["per_prompt"], share["mean_direction"], "share", TARGET))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
