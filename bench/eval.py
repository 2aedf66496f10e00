"""Evaluation throughput: batched evaluation vs item-by-item evaluation with the same engine.

Same work on both sides, in one run: the ``agent_gspo`` system (tiny random model, N agents x R
rounds, complete topology) on the same seeded sample of TEST items of a few benchmarks, through
:func:`components.evaluation.evaluate`. Ours uses ``eval.batch_size = --batch`` (all items of a
benchmark in one engine call); the peer uses batch size 1 (one rollout per item, how per-item
evaluation harnesses call a MAS). Every message is exactly ``--tokens`` tokens (EOS masked until
then), so both sides generate the same number of tokens. Figures are items/s over rollouts plus
grading (report/plot writing excluded: a constant that does not depend on batching), best of
``--repeats`` interleaved runs per side (the machine may be shared; the best run is the least
disturbed one). Defaults follow the ``smoke`` profile (3 agents x 2 rounds, 48-token messages,
512-token context budget).

    python bench/eval.py [--benchmarks gsm8k,aqua,mmlu] [--items 8] [--agents 3] [--rounds 2] [--tokens 48]

Needs prepared data (``agent-gspo prepare``; ``--data`` folder). Ends with
``bench eval: ours <x> items/s, peer <y> items/s, ratio <r>x (target 3x)``; exits 0.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from components.config import Config
from components.evaluation import System, evaluate
from components.mas.engine import RolloutEngine
from components.models import load_policy


def _run(cfg: Config, engine: RolloutEngine, data: Path, items: int):
    """One evaluation; returns (report, wall seconds of rollouts + grading)."""
    with tempfile.TemporaryDirectory() as out:
        rep = evaluate(cfg, limit=items, data_dir=data, out_dir=Path(out),
                       systems=[System("agent_gspo", engine, greedy=True)])
    return rep, rep.timings["agent_gspo"] + rep.timings["grading"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--benchmarks", default="gsm8k,aqua,mmlu")
    ap.add_argument("--items", type=int, default=8, help="items per benchmark")
    ap.add_argument("--batch", type=int, default=8, help="our eval.batch_size")
    ap.add_argument("--agents", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=48, help="tokens per message (fixed on both sides)")
    ap.add_argument("--context", type=int, default=512, help="mas.context_tokens")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved runs per side; the best is reported")
    ap.add_argument("--data", default="data", help="prepared data folder")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads for both sides (tiny matmuls: 1 avoids contention on shared CPUs)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    benchmarks = [b.strip() for b in args.benchmarks.split(",") if b.strip()]

    def cfg(batch: int) -> Config:
        return Config.model_validate({
            "model": {"name": "tiny-random"},
            "mas": {"agents": args.agents, "rounds": args.rounds, "topology": "complete",
                    "max_message_tokens": args.tokens, "context_tokens": args.context},
            "eval": {"benchmarks": benchmarks, "batch_size": batch, "baselines": []}})

    model, tok = load_policy("tiny-random", device=args.device)
    ours_cfg, peer_cfg = cfg(args.batch), cfg(1)
    engine = RolloutEngine(model, tok, ours_cfg.mas, device=args.device, min_new_tokens=args.tokens,
                           score_fn=lambda item, text: (False, None, None))
    n_items = args.items * len(benchmarks)
    print(f"settings: model=tiny-random device={args.device} threads={torch.get_num_threads()} "
          f"benchmarks={','.join(benchmarks)} items/benchmark={args.items} agents={args.agents} "
          f"rounds={args.rounds} topology=complete tokens/message={args.tokens} greedy; "
          f"ours batch_size={args.batch}, peer batch_size=1; same engine, same items")

    _run(cfg(args.batch), engine, Path(args.data), 1)  # warm-up: allocator, kernels, grader workers
    runs: dict[str, list] = {"ours": [], "peer": []}
    for _ in range(max(1, args.repeats)):
        runs["ours"].append(_run(ours_cfg, engine, Path(args.data), args.items))
        runs["peer"].append(_run(peer_cfg, engine, Path(args.data), args.items))
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
    print(f"bench eval: ours {ours_ips:.2f} items/s, peer {peer_ips:.2f} items/s, "
          f"ratio {ours_ips / peer_ips:.1f}x (target 3x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
