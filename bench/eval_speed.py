"""Evaluation speed of a profile: speed settings vs today's settings, with accuracy checked.

Both sides evaluate the untrained MAS of ``--profile`` (default ``results``: SmolLM2-135M-Instruct,
its MAS, message cap and ``eval.batch_size``) greedily on the same seeded TEST items of every
benchmark, through :func:`components.evaluation.evaluate`, with natural message lengths: a speed
setting that changes what the model writes (bf16 rounding flips some greedy choices) shows up in
both the time and the accuracy. Ours is the profile as committed (``--ours-set`` adds overrides);
the peer is the same profile under today's settings before the speed work, ``--peer-set``
(default ``model.dtype=float32``: fp32 weights and decoding). Figures are items/s over rollouts plus
grading, best of ``--repeats`` runs per side, the sides alternated. Accuracy is compared **paired**
(every item answered by both sides): ``difference ± paired SE``; "within SE" means
``|difference| <= SE``, i.e. accuracy unchanged within its standard error.

    python bench/eval_speed.py                                       # results profile, 4 items x 7 benchmarks
    python bench/eval_speed.py --items 10 --benchmarks gsm8k,mmlu
    python bench/eval_speed.py --model tiny-random --items 1 --repeats 1   # a logic check, seconds

Needs prepared data (``agent-gspo prepare``; ``--data``). Ends with
``bench eval_speed: ours <x> items/s, peer <y> items/s, ratio <r>x (target 2x)``; exits 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

if __package__ in (None, ""):  # `python bench/eval_speed.py`: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import add_eval_flags, ratio_line, timed_evaluation  # noqa: E402
from components.config import Config, load_config  # noqa: E402
from components.evaluation.runner import EvalReport  # noqa: E402
from components.mas.engine import RolloutEngine  # noqa: E402
from components.models import PolicyInit, load_policy  # noqa: E402
from experiments.stats import paired  # noqa: E402

TARGET = 2.0


def side_config(args: argparse.Namespace, overrides: list[str]) -> Config:
    """The profile with the side's overrides; the model and benchmarks as the flags say."""
    extra = list(overrides)
    if args.model:
        extra.append(f"model.name={args.model}")
    if args.benchmarks:
        extra.append(f"eval.benchmarks=[{args.benchmarks}]")
    return load_config(args.params, args.profile, [*extra, "eval.baselines=[]"])


def build_engine(cfg: Config, device: str) -> RolloutEngine:
    model, tok = load_policy(cfg.model.name, PolicyInit(seed=cfg.gspo.seed), cache_dir=cfg.model.cache_dir,
                             dtype=cfg.model.dtype, device=device, silence_marker=cfg.mas.silence_marker)
    return RolloutEngine(model, tok, cfg.mas, device=device)


def outcomes(rep: EvalReport) -> dict[str, bool]:
    """item id -> correct, over every benchmark"""
    return {f"{bench}/{o.id}": o.correct for bench, per in rep.per_item["agent_gspo"].items() for o in per}


def accuracy_line(ours: EvalReport, peer: EvalReport) -> str:
    a, b = outcomes(ours), outcomes(peer)
    if a.keys() != b.keys():
        return "accuracy: the two sides evaluated different items (no paired comparison)"
    ids = sorted(a)
    x, y = [float(a[i]) for i in ids], [float(b[i]) for i in ids]
    diff, se = paired(x, y)
    within = abs(diff) <= se if se > 0 else diff == 0
    return (f"accuracy: ours {sum(x) / len(x):.3f}, peer {sum(y) / len(y):.3f} on {len(ids)} paired items; "
            f"difference {diff:+.3f} ± {se:.3f} (paired SE): {'within' if within else 'NOT within'} one SE; "
            f"{sum(p != q for p, q in zip(x, y, strict=True))} item(s) answered differently")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="results", help="params.yaml profile (model, MAS, eval settings)")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--ours-set", action="append", default=[], metavar="KEY=VALUE",
                    help="overrides of the committed profile on our side (repeatable; default none)")
    ap.add_argument("--peer-set", action="append", default=None, metavar="KEY=VALUE",
                    help="today's settings, as overrides of the profile (repeatable; default model.dtype=float32)")
    ap.add_argument("--model", default=None, help="override model.name on both sides (tiny-random: logic check)")
    add_eval_flags(ap, items=4, repeats=1)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    peer_set = args.peer_set if args.peer_set is not None else ["model.dtype=float32"]
    cfgs = {"ours": side_config(args, args.ours_set), "peer": side_config(args, peer_set)}
    engines = {side: build_engine(cfg, args.device) for side, cfg in cfgs.items()}
    mas, benchmarks = cfgs["ours"].mas, cfgs["ours"].eval.benchmarks
    n_items = args.items * len(benchmarks)
    print(f"settings: profile={args.profile} model={cfgs['ours'].model.name} device={args.device} "
          f"threads={torch.get_num_threads()} benchmarks={','.join(benchmarks)} items/benchmark={args.items} "
          f"agents={mas.agents} rounds={mas.rounds} protocol={mas.protocol} cap={mas.max_message_tokens} "
          f"batch_size={cfgs['ours'].eval.batch_size} greedy, natural lengths; "
          f"ours: {' '.join(args.ours_set) or '(profile)'} (dtype {cfgs['ours'].model.dtype}); "
          f"peer: {' '.join(peer_set) or '(profile)'} (dtype {cfgs['peer'].model.dtype})")
    data = Path(args.data)
    for side in cfgs:  # warm-up: allocator, kernels, grader workers
        timed_evaluation(cfgs[side], engines[side], data, 1)
    runs: dict[str, list[tuple[EvalReport, float]]] = {"ours": [], "peer": []}
    for _ in range(max(1, args.repeats)):
        for side in ("ours", "peer"):
            runs[side].append(timed_evaluation(cfgs[side], engines[side], data, args.items))
    best = {side: min(rs, key=lambda r: r[1]) for side, rs in runs.items()}
    for side, (rep, wall) in best.items():
        completion = sum(r.tokens_completion for r in rep.table)
        walls = ", ".join(f"{r[1]:.1f}" for r in runs[side])
        print(f"{side}: {n_items} items in {wall:.1f}s (runs: {walls}; rollout {rep.timings['agent_gspo']:.1f}s, "
              f"grading {rep.timings['grading']:.1f}s), {completion} completion tokens "
              f"({completion / max(wall, 1e-9):.1f}/s), {sum(r.tokens_prompt for r in rep.table)} prompt tokens")
    print(accuracy_line(best["ours"][0], best["peer"][0]))
    print(ratio_line("eval_speed", n_items / best["ours"][1], n_items / best["peer"][1], "items/s", TARGET, digits=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
