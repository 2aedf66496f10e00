"""Rollout throughput: our batched engine vs one ``model.generate`` per agent turn (AgentPrune-style).

Same work on both sides, in one run: ours generates Q questions x G episodes x N agents x R rounds
with the batched engine; the peer then replays every one of those agent turns (the exact prompt ids
ours built) with one ``model.generate`` call each, as per-agent MAS frameworks call the LLM.
Both sides generate exactly ``--tokens`` tokens per message (EOS masked until then), with the same
sampling settings, so tokens/s compare like for like. Tiny random model on CPU by default;
``--model smollm2-shape`` is a random-init model of SmolLM2-135M's shape (no weights travel; bf16 on
CUDA), the size whose decode step the first H200 run found host-bound (bench/README.md).

    python bench/rollout.py [--model tiny-random|smollm2-shape] [--questions 4] [--group 4] [--agents 4]
                            [--rounds 2] [--tokens 32] [--device cpu|cuda]

Ends with ``bench rollout: ours <x> tokens/s, peer <y> tokens/s, ratio <r>x (target 4x)``; exits 0.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

if __package__ in (None, ""):  # `python bench/rollout.py`: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import MODELS, BenchInputError, BenchSettings, build_policy, ratio_line  # noqa: E402
from components.config import MasConfig  # noqa: E402
from components.data.item import Item  # noqa: E402
from components.mas.calls import EngineOptions  # noqa: E402
from components.mas.engine import RolloutEngine  # noqa: E402


def _items(q: int) -> list[Item]:
    return [Item(id=f"bench/{i}", benchmark="gsm8k", split="test", answer=str(3 * i + 8), answer_type="numeric",
                 question=f"Tom has {i + 3} apples and buys {2 * i + 5} more. How many apples does he have?")
            for i in range(q)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=MODELS, default="tiny-random",
                    help="tiny-random (default) or smollm2-shape (random init of SmolLM2-135M's config)")
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32, help="tokens per message (fixed on both sides)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads for both sides (tiny matmuls: 1 avoids contention on shared CPUs)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    bench = BenchSettings(model=args.model, device=args.device, seed=args.seed, threads=args.threads)
    try:
        bench.validate()  # a clear error for --device cuda without CUDA
    except BenchInputError as exc:
        print(f"bench rollout: error: {exc}", file=sys.stderr)
        return exc.exit_code
    model, tok = build_policy(bench)  # fp32 on CPU, bf16 on CUDA
    shape = ("tiny-random llama (hidden 64, 2 layers)" if args.model == "tiny-random"
             else "smollm2-shape (random init, hidden 576, 30 layers)")
    cfg = MasConfig(agents=args.agents, rounds=args.rounds, topology="complete", max_message_tokens=args.tokens,
                    temperature=0.8, top_p=1.0)
    engine = RolloutEngine(model, tok, cfg, device=args.device, options=EngineOptions(min_new_tokens=args.tokens))
    items = _items(args.questions)
    print(f"settings: model={shape} dtype={str(bench.dtype).removeprefix('torch.')} device={args.device} "
          f"threads={torch.get_num_threads()} questions={args.questions} G={args.group} agents={args.agents} "
          f"rounds={args.rounds} topology=complete tokens/message={args.tokens} T={cfg.temperature}")

    engine.rollout(items[:1], 1, seed=args.seed)  # warm-up (allocator, kernels)
    t0 = time.perf_counter()
    episodes = engine.rollout(items, args.group, seed=args.seed)
    ours_s = time.perf_counter() - t0
    turns = [m for ep in episodes for m in ep.messages]
    ours_tokens = sum(m.completion_tokens for m in turns)
    st = engine.last_stats
    print(f"ours: {len(turns)} messages in {st.calls} batched calls ({st.decode_steps} decode steps), "
          f"{ours_tokens} tokens in {ours_s:.2f}s (generate {st.generate_s:.2f}s)")

    gen_kw = dict(max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=True, temperature=cfg.temperature,
                  top_p=1.0, top_k=0, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(args.seed)
    with torch.no_grad():
        ids = torch.tensor([turns[0].prompt_ids], device=args.device)
        model.generate(ids, attention_mask=torch.ones_like(ids), **gen_kw)  # warm-up
        t0 = time.perf_counter()
        peer_tokens = 0
        for m in turns:
            ids = torch.tensor([m.prompt_ids], device=args.device)
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **gen_kw)
            peer_tokens += out.shape[1] - ids.shape[1]
        peer_s = time.perf_counter() - t0
    print(f"peer: {len(turns)} messages in {len(turns)} model.generate calls, {peer_tokens} tokens in {peer_s:.2f}s")
    if peer_tokens != ours_tokens:
        print(f"warning: token counts differ (ours {ours_tokens}, peer {peer_tokens})")
    ours_tps, peer_tps = ours_tokens / ours_s, peer_tokens / peer_s
    print(ratio_line("rollout", ours_tps, peer_tps, "tokens/s", 4, digits=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
