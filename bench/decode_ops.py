"""Operations dispatched per decode step: our batched decoder vs ``model.generate``.

Why count operations: on the first H200 run one decode step of 32 rows on the SmolLM2 shape took
~115 ms while its arithmetic needs well under 1 ms (bench/README.md), so in eager mode the step's
cost is the host's per-operation overhead (dispatch and kernel launch), and that scales with the
number of operations each step dispatches. Counting them needs no GPU: the same Python code
dispatches the same operations on CPU. ``TorchDispatchMode`` sees every aten call below autograd,
views included (views launch no kernel; the bench prints the count without them too).

Both sides generate a fixed number of tokens (EOS masked) for the same batch size; the count per
step is the difference between a long and a short run divided by the extra steps, so prefill,
warm-up and per-call setup cancel out. Here lower is better: the ratio is ours / peer, and the
target is to stay at or below 1x.

    python bench/decode_ops.py [--model smollm2-shape|tiny-random] [--rows 8] [--mask 4d|2d]

``--mask 2d`` counts what our decoder dispatches on CUDA (transformers' 2-D padding mask; the
default ``4d`` is the ready mask it passes on CPU).

Ends with ``bench decode_ops: ours <x> ops/step, peer <y> ops/step, ratio <r>x (target 1x)`` (at most).
"""

from __future__ import annotations

import argparse
import collections
import functools
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

if __package__ in (None, ""):  # `python bench/decode_ops.py`: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import MODELS, BenchSettings, build_policy, ratio_line  # noqa: E402
from components.config import MasConfig  # noqa: E402
from components.data.item import Item  # noqa: E402
from components.mas.calls import EngineOptions  # noqa: E402
from components.mas.engine import RolloutEngine  # noqa: E402

VIEWS = {"aten.view", "aten._unsafe_view", "aten.t", "aten.transpose", "aten.slice", "aten.unsqueeze",
         "aten.squeeze", "aten.expand", "aten.select", "aten.permute", "aten.reshape", "aten.alias",
         "aten.as_strided", "aten.detach"}
"""metadata-only operations: dispatched (host cost) but no kernel launched"""


class OpCounter(TorchDispatchMode):
    """Counts aten operations by name while active."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _ours(model, tok, rows: int, tokens: int, mask: str = "4d") -> collections.Counter[str]:
    """One rollout call of ``rows`` messages (rows/2 questions x G 2, one agent, one round), with the
    step's padding mask as the CPU decoder passes it (``4d``) or as the CUDA one does (``2d``)."""
    items = [Item(id=f"ops/{i}", benchmark="gsm8k", split="test", answer="1", answer_type="numeric",
                  question=f"What is {i} plus one?") for i in range(rows // 2)]
    cfg = MasConfig(agents=1, rounds=1, topology="complete", max_message_tokens=tokens, temperature=0.8, top_p=1.0)
    engine = RolloutEngine(model, tok, cfg, device="cpu", options=EngineOptions(min_new_tokens=tokens))
    engine.decoder.mask_4d = mask == "4d"
    with OpCounter() as counter:
        engine.rollout(items, 2, seed=0)
    return counter.counts


def _peer(model, tok, rows: int, tokens: int) -> collections.Counter[str]:
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]] * rows)
    with OpCounter() as counter, torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, min_new_tokens=tokens,
                       do_sample=True, temperature=0.8, top_k=0, top_p=1.0, pad_token_id=tok.pad_token_id,
                       eos_token_id=tok.eos_token_id)
    return counter.counts


def per_step(side, model, tok, rows: int, short: int, long: int) -> collections.Counter[str]:
    """Operations per decode step by name: (count at ``long`` tokens - count at ``short``) / the extra steps."""
    a, b = side(model, tok, rows, short), side(model, tok, rows, long)
    return collections.Counter({k: (b[k] - a[k]) / (long - short) for k in b if b[k] != a[k]})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=MODELS, default="smollm2-shape")
    ap.add_argument("--rows", type=int, default=8, help="sequences decoded together (even)")
    ap.add_argument("--short", type=int, default=4, help="tokens in the short run")
    ap.add_argument("--long", type=int, default=12, help="tokens in the long run")
    ap.add_argument("--mask", choices=("4d", "2d"), default="4d",
                    help="our step's padding mask: 4d as decoded on CPU, 2d as on CUDA (components/mas/decode.py)")
    args = ap.parse_args(argv)
    if args.rows < 2 or args.rows % 2 or not 1 <= args.short < args.long:
        print("bench decode_ops: error: --rows must be even and >= 2, and 1 <= --short < --long", file=sys.stderr)
        return 2
    torch.set_num_threads(min(2, torch.get_num_threads()))
    model, tok = build_policy(BenchSettings(model=args.model))
    print(f"settings: model={args.model} device=cpu rows={args.rows} tokens {args.short} vs {args.long} "
          f"mask={args.mask}")
    ours = per_step(functools.partial(_ours, mask=args.mask), model, tok, args.rows, args.short, args.long)
    peer = per_step(_peer, model, tok, args.rows, args.short, args.long)
    for name, counts in (("ours", ours), ("peer", peer)):
        kernels = sum(v for k, v in counts.items() if k not in VIEWS)
        top = ", ".join(f"{k.removeprefix('aten.')} {v:.0f}" for k, v in counts.most_common(8))
        print(f"{name}: {sum(counts.values()):.0f} ops per decode step, {kernels:.0f} without views; {top}")
    print(ratio_line("decode_ops", sum(ours.values()), sum(peer.values()), "ops/step", 1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
