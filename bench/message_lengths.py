"""How long the untrained MAS's messages are when the cap is out of the way: which cap would bind.

The results profile caps messages at ``mas.max_message_tokens`` (64), and the committed runs
report how often a message hit it (54 % for the untrained MAS). This measures what a higher cap
would change: the untrained MAS of ``--profile`` (default ``results``) answers, greedily, the
same seeded TEST items per benchmark that evaluation samples (``eval.seed``), with the cap raised
to ``--cap`` (default 256). For each candidate cap k it prints the share of messages that are at
least k tokens long (those a cap of k would cut) and the completion tokens a cap of k would keep
relative to a cap of 64 (a first-order cost estimate: later rounds read longer messages too, so
prompts grow as well). Round-1 messages read round-0 messages of the raised cap, so the figures
describe the team at ``--cap``, not at k.

    python bench/message_lengths.py                      # results profile, 6 items x 7 benchmarks, cap 256
    python bench/message_lengths.py --items 2 --benchmarks gsm8k --model tiny-random   # a logic check

Needs prepared data (``agent-gspo prepare``; ``--data``). Ends with one line per candidate cap,
``message_lengths: cap <k> cuts <share> of <n> messages; completion tokens <x>x of cap 64``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # `python bench/message_lengths.py`: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from components.config import load_config  # noqa: E402
from components.data.prepare import load_split  # noqa: E402
from components.data.sampling import sample_items  # noqa: E402
from components.mas.engine import RolloutEngine  # noqa: E402
from components.models import PolicyInit, load_policy  # noqa: E402

CAPS = (64, 96, 128, 192, 256)


def cap_table(lengths: list[int], caps: tuple[int, ...] = CAPS) -> list[tuple[int, float, float]]:
    """(cap k, share of messages >= k tokens, completion tokens kept at k / kept at 64) per cap."""
    at_64 = sum(min(n, 64) for n in lengths) or 1
    return [(k, sum(n >= k for n in lengths) / max(1, len(lengths)), sum(min(n, k) for n in lengths) / at_64)
            for k in caps]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="results")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--model", default=None, help="model name (default: the profile's)")
    ap.add_argument("--benchmarks", default=None, help="comma list (default: the profile's eval.benchmarks)")
    ap.add_argument("--items", type=int, default=6, help="items per benchmark (the seeded evaluation sample)")
    ap.add_argument("--cap", type=int, default=256, help="message cap while measuring")
    ap.add_argument("--data", default="data", help="prepared data folder")
    args = ap.parse_args()
    overrides = [f"mas.max_message_tokens={args.cap}"] + ([f"model.name={args.model}"] if args.model else [])
    cfg = load_config(args.params, args.profile, overrides)
    model, tok = load_policy(cfg.model.name, PolicyInit(seed=cfg.gspo.seed), cache_dir=cfg.model.cache_dir,
                             dtype=cfg.model.dtype, device="cpu", silence_marker=cfg.mas.silence_marker)
    engine = RolloutEngine(model, tok, cfg.mas, device="cpu")
    benchmarks = args.benchmarks.split(",") if args.benchmarks else list(cfg.eval.benchmarks)
    print(f"settings: profile {args.profile}, model {cfg.model.name}, {cfg.mas.agents} agents x {cfg.mas.rounds} "
          f"rounds, cap {args.cap}, {args.items} items per benchmark (eval.seed {cfg.eval.seed}), greedy")
    everything: list[int] = []
    start = time.perf_counter()
    for b in benchmarks:
        split = load_split(Path(args.data), b, "test")
        items = sample_items(split, args.items, cfg.eval.seed, where=f"{args.data}/{b}")
        episodes = engine.rollout(items, 1, seed=cfg.eval.seed, greedy=True)
        lengths = [m.completion_tokens for e in episodes for m in e.messages if not m.silent]
        everything += lengths
        shares = ", ".join(f">= {k}: {share:.2f}" for k, share, _ in cap_table(lengths))
        print(f"{b}: {len(lengths)} messages; {shares} ({time.perf_counter() - start:.0f} s)", flush=True)
    for k, share, cost in cap_table(everything):
        print(f"message_lengths: cap {k} cuts {share:.2f} of {len(everything)} messages; "
              f"completion tokens {cost:.2f}x of cap 64")
    return 0


if __name__ == "__main__":
    sys.exit(main())
