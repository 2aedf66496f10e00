"""The real workload's rollout: our engine vs a TRL ``rollout_func`` playing the same episodes.

Both sides play Q questions x G episodes of the ``--profile``'s team (``results``: 3 agents x 2
rounds, complete topology, its message cap and temperature), every message exactly ``--tokens``
long (EOS masked; ours: ``min_new_tokens``), on the same model and questions.

* **ours**: :class:`components.mas.engine.RolloutEngine` as the trainer drives it (one batched
  call per round, prompt prefixes reused across rounds, ``--decode`` = ``mas.decode``).
* **peer**: what a TRL user would pass as ``GRPOTrainer(rollout_func=...)`` (trl 1.16: a
  function of ``(prompts, trainer)`` returning ``prompt_ids``, ``completion_ids`` and
  ``logprobs``): each round, ONE ``model.generate`` over every agent of every episode (left
  padding, sampling, ``output_logits`` for the log-probs), the round-2 chat prompt holding the
  other agents' round-1 messages. :func:`make_rollout_func` builds it; the bench calls it
  directly (no trainer needed for a rollout).

Throughput = completion tokens / wall time, one warm-up call per side first (graph capture,
allocator), best of ``--repeats``. Ends with
``bench multi_agent: ours <x> tokens/s, peer <y> tokens/s, ratio <r>x (target 3x)``.

    python bench/multi_agent.py --device cuda --model smollm2-shape --questions 8 --group 8
    python bench/multi_agent.py --questions 1 --group 2 --tokens 4 --repeats 1    # CPU logic check
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # `python bench/multi_agent.py`: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import MODELS, BenchInputError, BenchSettings, build_policy, ratio_line, sync  # noqa: E402
from components.data.item import Item  # noqa: E402

TARGET = 3.0


def make_rollout_func(model: Any, tok: Any, *, agents: int, rounds: int, tokens: int, temperature: float,
                      group: int) -> Callable[[list[Any], Any], dict[str, Any]]:
    """A TRL ``rollout_func``: G episodes per prompt, one ``generate`` per round (see module docstring).
    Every message is returned as a completion (prompt ids, ids, log-probs), agent-major per round."""
    device = next(model.parameters()).device

    def rollout_func(prompts: list[Any], trainer: Any = None) -> dict[str, Any]:
        episodes = [(str(p), e) for p in prompts for e in range(group)]
        said: dict[tuple[int, int], str] = {}  # (episode, agent) -> last message
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for r in range(rounds):
            chats = []
            for i, (question, _) in enumerate(episodes):
                for a in range(agents):
                    user = question if r == 0 else question + "\n\nThe other agents said:\n" + "\n".join(
                        f"Agent {b}: {said[(i, b)]}" for b in range(agents) if b != a)
                    chats.append([{"role": "system", "content": f"You are agent {a} of a team of {agents}."},
                                  {"role": "user", "content": user}])
            texts = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
            tok.padding_side = "left"
            enc = tok(texts, add_special_tokens=False, padding=True, return_tensors="pt").to(device)
            with torch.no_grad():
                gen = model.generate(**enc, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=True,
                                     temperature=temperature, top_p=1.0, top_k=0, pad_token_id=tok.pad_token_id,
                                     eos_token_id=tok.eos_token_id, return_dict_in_generate=True, output_logits=True)
            new = gen.sequences[:, enc["input_ids"].shape[1]:]
            logp = torch.log_softmax(torch.stack(gen.logits, 1).float() / temperature, -1)
            lps = logp.gather(-1, new[..., None]).squeeze(-1)
            for row, (ids, lp) in enumerate(zip(new.tolist(), lps.tolist(), strict=True)):
                n = next((k + 1 for k, t in enumerate(ids) if t == tok.eos_token_id), len(ids))
                said[(row // agents, row % agents)] = tok.decode(ids[:n], skip_special_tokens=True)
                prompt = enc["input_ids"][row][enc["attention_mask"][row].bool()].tolist()
                out["prompt_ids"].append(prompt)
                out["completion_ids"].append(ids[:n])
                out["logprobs"].append(lp[:n])
        return out

    return rollout_func


def _items(q: int) -> list[Item]:
    return [Item(id=f"bench/{i}", benchmark="gsm8k", split="test", answer=str(3 * i + 8), answer_type="numeric",
                 question=f"Tom has {i + 3} apples and buys {2 * i + 5} more. How many apples does he have?")
            for i in range(q)]


def _best(run: Callable[[], int], device: str, repeats: int) -> tuple[int, float]:
    run()  # warm-up: graph capture, allocator, kernels
    best = (0, float("inf"))
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        n = run()
        sync(device)
        best = min(best, (n, time.perf_counter() - t0), key=lambda x: x[1] / max(x[0], 1))
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", choices=MODELS, default="tiny-random")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--profile", default="results", help="params.yaml profile whose mas section both sides play")
    ap.add_argument("--questions", type=int, default=2)
    ap.add_argument("--group", type=int, default=8, help="episodes per question (G)")
    ap.add_argument("--tokens", type=int, default=0, help="tokens per message, fixed (0: the profile's cap)")
    ap.add_argument("--decode", choices=("dynamic", "static_graph"), default="static_graph", help="our mas.decode")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from components.config import load_config
    from components.mas.calls import EngineOptions
    from components.mas.engine import RolloutEngine

    bench = BenchSettings(model=args.model, device=args.device, seed=args.seed)
    try:
        bench.validate()
        if min(args.questions, args.group, args.repeats) < 1 or args.tokens < 0:
            raise BenchInputError("--questions, --group and --repeats must be >= 1, --tokens >= 0")
    except BenchInputError as exc:
        print(f"bench multi_agent: error: {exc}", file=sys.stderr)
        return exc.exit_code
    if args.device == "cpu":
        torch.set_num_threads(1)
    mas = load_config(None, args.profile).mas
    tokens = args.tokens or mas.max_message_tokens
    mas = mas.model_copy(update={"max_message_tokens": tokens, "decode": args.decode,
                                 "stop_check_every": 8 if args.decode == "static_graph" else 1})
    model, tok = build_policy(bench)
    items = _items(args.questions)
    settings = {"profile": args.profile, "model": args.model, "device": args.device,
                "dtype": str(bench.dtype).removeprefix("torch."), "questions": args.questions, "G": args.group,
                "agents": mas.agents, "rounds": mas.rounds, "protocol": mas.protocol,
                "tokens/message": f"{tokens} (fixed)", "T": mas.temperature,
                "rows/round": args.questions * args.group * mas.agents, "ours decode": args.decode}
    if args.device.startswith("cuda"):
        settings["gpu"] = torch.cuda.get_device_name(args.device)
    print("settings: " + " ".join(f"{k}={v}" for k, v in settings.items()), flush=True)
    engine = RolloutEngine(model, tok, mas, device=args.device, options=EngineOptions(min_new_tokens=tokens))

    def ours() -> int:
        eps = engine.rollout(items, args.group, seed=args.seed)
        return sum(m.completion_tokens for ep in eps for m in ep.messages)

    rollout_func = make_rollout_func(model, tok, agents=mas.agents, rounds=mas.rounds, tokens=tokens,
                                     temperature=mas.temperature, group=args.group)

    def peer() -> int:
        torch.manual_seed(args.seed)
        return sum(map(len, rollout_func([it.question for it in items], None)["completion_ids"]))

    o_n, o_s = _best(ours, args.device, args.repeats)
    st = engine.last_stats
    pool = engine.decoder.pool
    graph = ""
    if pool is not None:
        how = (pool.capture_error or "captured") if pool.capture else "eager"
        graph = f"; graph capture {pool.capture_s:.1f}s apart, {how}"
    print(f"ours: {o_n} tokens in {o_s:.2f}s, {o_n / o_s:.0f} tokens/s ({st.calls} batched calls, "
          f"{st.decode_steps} decode steps, prefix ids reused {st.prefix_tokens_reused}{graph})", flush=True)
    p_n, p_s = _best(peer, args.device, args.repeats)
    print(f"peer: {p_n} tokens in {p_s:.2f}s, {p_n / p_s:.0f} tokens/s ({mas.rounds} model.generate calls)")
    if o_n != p_n:
        print(f"note: token counts differ (ours {o_n}, peer {p_n}): silent messages (adaptive protocol) stop early")
    print(ratio_line("multi_agent", o_n / o_s, p_n / p_s, "tokens/s", TARGET))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
