"""Evaluation throughput: batched evaluation vs item-by-item evaluation with the same engine.

Same work on both sides, in one run: the ``agent_gspo`` system of the ``--profile`` (default
``smoke``: SmolLM2-135M-Instruct, 3 agents x 2 rounds, 32-token messages, 256-token context
budget, ``eval.batch_size`` 8) on the same seeded sample of TEST items of every benchmark of the
profile, through :func:`components.evaluation.evaluate`. Ours uses the profile's
``eval.batch_size`` (greedy systems pool all benchmarks' items into shared engine calls); the peer
uses batch size 1 (one rollout per item, how per-item evaluation harnesses call a MAS). Every
message is exactly the profile's message length (EOS masked until then), so both sides generate
the same number of tokens. Figures are items/s over rollouts plus grading (report/plot writing
excluded: a constant that does not depend on batching), best of ``--repeats`` interleaved runs per
side (the machine may be shared; the best run is the least disturbed one).

    python bench/eval.py [--profile smoke] [--items 3] [--benchmarks gsm8k,aqua] [--model tiny-random]

Needs prepared data (``agent-gspo prepare``; ``--data`` folder). Ends with
``bench eval: ours <x> items/s, peer <y> items/s, ratio <r>x (target 3x)``; exits 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

if __package__ in (None, ""):  # `python bench/eval.py`: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import add_eval_flags, ratio_line, timed_evaluation  # noqa: E402
from components.config import Config, load_config  # noqa: E402
from components.mas.calls import EngineOptions  # noqa: E402
from components.mas.engine import RolloutEngine  # noqa: E402
from components.models import load_policy  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="smoke", help="params.yaml profile giving model, MAS and eval settings")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--model", default=None, help="override model.name (tiny-random: a quick logic check)")
    ap.add_argument("--batch", type=int, default=None, help="our eval.batch_size (default: the profile's)")
    add_eval_flags(ap, items=3, repeats=2)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    base = load_config(args.params, profile=args.profile)
    raw = base.model_dump()
    if args.model:
        raw["model"]["name"] = args.model
    if args.benchmarks:
        raw["eval"]["benchmarks"] = [b.strip() for b in args.benchmarks.split(",") if b.strip()]
    raw["eval"]["baselines"] = []
    batch = args.batch or base.eval.batch_size

    def cfg(batch_size: int) -> Config:
        return Config.model_validate({**raw, "eval": {**raw["eval"], "batch_size": batch_size}})

    ours_cfg, peer_cfg = cfg(batch), cfg(1)
    mas, benchmarks = ours_cfg.mas, ours_cfg.eval.benchmarks
    model, tok = load_policy(ours_cfg.model.name, cache_dir=ours_cfg.model.cache_dir, dtype=ours_cfg.model.dtype,
                             device=args.device)
    engine = RolloutEngine(model, tok, mas, device=args.device,
                           options=EngineOptions(min_new_tokens=mas.max_message_tokens))
    n_items = args.items * len(benchmarks)
    print(f"settings: profile={args.profile} model={ours_cfg.model.name} device={args.device} "
          f"threads={torch.get_num_threads()} benchmarks={','.join(benchmarks)} items/benchmark={args.items} "
          f"agents={mas.agents} rounds={mas.rounds} topology={mas.topology} tokens/message={mas.max_message_tokens} "
          f"context={mas.context_tokens} greedy; ours batch_size={batch}, peer batch_size=1; same engine, same items")

    timed_evaluation(ours_cfg, engine, Path(args.data), 1)  # warm-up: allocator, kernels, grader workers
    runs: dict[str, list] = {"ours": [], "peer": []}
    for _ in range(max(1, args.repeats)):
        runs["ours"].append(timed_evaluation(ours_cfg, engine, Path(args.data), args.items))
        runs["peer"].append(timed_evaluation(peer_cfg, engine, Path(args.data), args.items))
    best = {side: min(rs, key=lambda r: r[1]) for side, rs in runs.items()}
    (ours, ours_s), (peer, peer_s) = best["ours"], best["peer"]
    tokens = [sum(r.tokens_completion for r in rep.table) for rep in (ours, peer)]
    for side, (rep, wall) in best.items():
        walls = ", ".join(f"{r[1]:.2f}" for r in runs[side])
        print(f"{side}: {n_items} items in {wall:.2f}s wall (runs: {walls}; rollout {rep.timings['agent_gspo']:.2f}s, "
              f"grading {rep.timings['grading']:.2f}s), "
              f"{sum(r.tokens_completion for r in rep.table)} completion tokens, "
              f"{sum(r.tokens_prompt for r in rep.table)} prompt tokens")
    if tokens[0] != tokens[1]:
        print(f"warning: completion token counts differ (ours {tokens[0]}, peer {tokens[1]})")
    if ours.meta["item_ids"] != peer.meta["item_ids"]:
        print("warning: the two sides evaluated different items")
    ours_ips, peer_ips = n_items / ours_s, n_items / peer_s
    print(ratio_line("eval", ours_ips, peer_ips, "items/s", 3, digits=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
