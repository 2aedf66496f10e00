"""Wall-clock time per decode step: our batched decoder vs ``model.generate``, and where it goes.

Why: on the H200 (bench/README.md) our side of ``train_step.py`` generated 4,096 tokens in 19.8 s
against 7.6 s for TRL's ``model.generate`` on the same model, while ``decode_ops.py`` counts only
11 % more operations per step on our side. So the difference is not the operation count; this
bench times the step itself on the device and, with ``--profile``, counts per step what the
profiler sees (CUDA runtime calls: kernel launches, synchronisations, copies; aten operations),
printing the entries where the two sides differ most.

Both sides decode the same ``--rows`` prompts of ``--prompt`` random ids (no padding), sampling
at T 0.8 with EOS masked, so every row runs ``n`` steps; the time per step is the difference
between a ``--long`` and a ``--short`` run divided by the extra steps (prefill and per-call
set-up cancel), best of ``--repeats``. Lower is better: the ratio is ours / peer, target <= 1x.
``--mask2d`` also times our decoder with the padding mask it does not pick on this device (the
ready 4-D one or transformers' 2-D one); ``--engine`` also times it through the rollout engine
as the trainer drives it (chat prompts of GSM8K questions, G 8); ``--static`` also
times it on the static cache, compiled by ``torch.compile`` on CUDA (what ``mas.static_cache``
runs; the first call includes the compilation and is not timed); ``--graph`` also times
``mas.decode=static_graph`` (components/mas/static_decode.py: the step replayed as a CUDA graph,
the stop check every ``--stop-check-every`` tokens), prints its first-capture time apart, its
tokens/s at ``--rows`` (``bench decode_rows<rows>``) and ``bench decode_step_graph``.

    python bench/decode_step.py --device cuda [--rows 32] [--profile] [--mask2d] [--engine] [--static]
    python bench/decode_step.py --model tiny-random --short 2 --long 6     # logic check on CPU

Ends with ``bench decode_step: ours <x> ms/step, peer <y> ms/step, ratio <r>x (target 1x)``.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

if __package__ in (None, ""):  # `python bench/decode_step.py`: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import MODELS, BenchSettings, build_policy, ratio_line, sync  # noqa: E402
from components.mas.decode import DecodeOptions, Decoder, Sampling, StopIds  # noqa: E402

Side = Callable[[int], None]
"""decode every row for exactly n new tokens"""

RUNTIME_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                 "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaMemsetAsync",
                 "cudaEventRecord", "cudaStreamWaitEvent")
"""the CUDA runtime/driver calls worth counting per step (launches, synchronisations, copies)"""


def make_sides(model, tok, args: argparse.Namespace, device: torch.device) -> dict[str, Side]:
    """The decoders timed: ``ours`` (and ``ours_static`` with --static) and ``peer`` (model.generate)."""
    gen = torch.Generator().manual_seed(0)
    low, high = 16, tok.vocab_size if hasattr(tok, "vocab_size") else model.config.vocab_size
    special = set(getattr(tok, "all_special_ids", []) or [])
    ids = torch.randint(low, high, (args.rows, args.prompt), generator=gen)
    ids = ids.masked_fill(torch.isin(ids, torch.tensor(sorted(special) or [-1])), low)
    prompts = ids.tolist()
    stops = StopIds(eos=tok.eos_token_id, pad=tok.pad_token_id)
    ids_d = ids.to(device)

    def ours_with(decoder: Decoder) -> Side:
        def side(n: int) -> None:
            g = torch.Generator(device=device).manual_seed(1)
            decoder.generate(prompts, Sampling(max_new_tokens=n, min_new_tokens=n, temperature=0.8), g)
        side.decoder, side.prompts = decoder, prompts  # type: ignore[attr-defined]  # (graph_check reads them)
        return side

    def peer(n: int) -> None:
        with torch.no_grad():
            model.generate(ids_d, attention_mask=torch.ones_like(ids_d), max_new_tokens=n, min_new_tokens=n,
                           do_sample=True, temperature=0.8, top_k=0, top_p=1.0, pad_token_id=tok.pad_token_id,
                           eos_token_id=tok.eos_token_id)

    sides = {} if args.graph_only else {"ours": ours_with(Decoder(model, stops, device=device))}
    if args.mask2d:  # the other padding mask than the decoder picks on this device (see Decoder)
        other = Decoder(model, stops, device=device)
        other.mask_4d = not other.mask_4d
        sides["ours_mask4d" if other.mask_4d else "ours_mask2d"] = ours_with(other)
    if args.static:
        backend = "inductor" if device.type == "cuda" else None  # torch.compile's inductor: CUDA only here
        static = DecodeOptions(static_cache=True, compile_backend=backend)
        sides["ours_static"] = ours_with(Decoder(model, stops, device=device, options=static))
    if args.graph or args.graph_only:  # mas.decode=static_graph: a CUDA graph per step (eager on CPU)
        graph = DecodeOptions(graph=True, stop_check_every=args.stop_check_every)
        sides["ours_graph"] = ours_with(Decoder(model, stops, device=device, options=graph))
    if args.engine:
        sides["ours_engine"] = engine_side(model, tok, args, device)
    sides["peer"] = peer
    return sides


def engine_side(model, tok, args: argparse.Namespace, device: torch.device) -> Side:
    """Our decoder as the trainer drives it: ``single_cot_engine`` rollouts (1 agent, 1 round) of
    rows / 8 questions x G 8, the chat prompts ``train_step.py`` decodes (GSM8K when prepared)."""
    from bench.common import load_questions
    from components.config import MasConfig
    from components.mas.baselines import single_cot_engine
    from components.mas.calls import EngineOptions

    items, source = load_questions(max(1, args.rows // 8), "data")
    told = False

    def side(n: int) -> None:
        nonlocal told
        cfg = MasConfig(agents=1, rounds=1, max_message_tokens=n, temperature=0.8, top_p=1.0)
        engine = single_cot_engine(model, tok, cfg, device=device, options=EngineOptions(min_new_tokens=n))
        eps = engine.rollout(items, min(8, args.rows), seed=1)
        if not told:  # say once what the engine decodes
            prompt = sum(len(ep.messages[0].prompt_ids) for ep in eps) / len(eps)
            print(f"ours_engine: {len(eps)} rows, chat prompts of {prompt:.0f} ids on average, questions: {source}")
            told = True

    return side


def _tokens_per_s(rows: int, ms: float) -> float:
    """``rows`` tokens per step; NaN when noise made the step-time difference <= 0 (tiny CPU checks)."""
    return rows * 1e3 / ms if ms > 0 else float("nan")


def graph_check(graph_side: Side, model, tok, device: torch.device, n: int = 16) -> str:
    """Greedy ids and log-probs of the static-graph decoder against the dynamic one on the same prompts
    (captured on CUDA): a report, not a failure (bf16 rounds the two attention shapes differently)."""
    dyn = Decoder(model, StopIds(eos=tok.eos_token_id, pad=tok.pad_token_id), device=device)
    prompts, sampling = graph_side.prompts, Sampling(max_new_tokens=n, greedy=True)  # type: ignore[attr-defined]
    a, b = dyn.generate(prompts, sampling), graph_side.decoder.generate(prompts, sampling)  # type: ignore[attr-defined]
    same = sum(x == y for x, y in zip(a.ids, b.ids, strict=True))
    diff = max((abs(p - q) for x, y in zip(a.logprobs, b.logprobs, strict=True) for p, q in zip(x, y, strict=False)),
               default=0.0)
    return (f"graph check: {same}/{len(prompts)} rows with the dynamic decoder's greedy ids over {n} tokens, "
            f"max |log-prob difference| {diff:.2g} ({next(model.parameters()).dtype})")


def ms_per_step(side: Side, device: torch.device, short: int, long: int, repeats: int) -> float:
    """Best of ``repeats``: (time at ``long`` tokens - time at ``short``) / the extra steps, in ms."""
    side(short)  # warm-up (allocator, kernels, compilation)
    best = float("inf")
    for _ in range(repeats):
        times = []
        for n in (short, long):
            sync(device)
            t0 = time.perf_counter()
            side(n)
            sync(device)
            times.append(time.perf_counter() - t0)
        best = min(best, (times[1] - times[0]) / (long - short) * 1e3)
    return best


Profile = tuple[collections.Counter[str], collections.Counter[str]]
"""per decode step, by event name: (calls, self CPU time in µs)"""


def profile_step(side: Side, device: torch.device, short: int, long: int) -> Profile:
    """Profiler events per decode step by name: (value at ``long`` - value at ``short``) / extra steps."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    runs = []
    for n in (short, long):
        with profile(activities=acts) as prof:
            side(n)
            sync(device)
        events = prof.key_averages()
        runs.append((collections.Counter({e.key: e.count for e in events}),
                     collections.Counter({e.key: e.self_cpu_time_total for e in events})))
    extra = long - short

    def per_step(a: collections.Counter[str], b: collections.Counter[str]) -> collections.Counter[str]:
        return collections.Counter({k: (b[k] - a[k]) / extra for k in b.keys() | a.keys() if b[k] != a[k]})

    return per_step(runs[0][0], runs[1][0]), per_step(runs[0][1], runs[1][1])


def report_profiles(profiles: dict[str, Profile]) -> None:
    """Per side: operations, runtime calls and host time per step; then where ours and peer differ most."""
    for name, (calls, cpu_us) in profiles.items():
        runtime = ", ".join(f"{k} {calls[k]:.0f}" for k in RUNTIME_CALLS if calls.get(k))
        aten = sum(v for k, v in calls.items() if k.startswith("aten::"))
        print(f"profile {name}: per step {aten:.0f} aten ops, {sum(cpu_us.values()) / 1e3:.1f} ms self CPU; "
              f"{runtime or 'no CUDA runtime calls (CPU)'}")
    if "ours" in profiles and "peer" in profiles:
        for i, (what, unit) in enumerate((("calls", ""), ("self CPU", " µs"))):
            ours, peer = profiles["ours"][i], profiles["peer"][i]
            diff = sorted(ours.keys() | peer.keys(), key=lambda k: -abs(ours[k] - peer[k]))[:14]
            print(f"profile ours - peer, {what} per step: "
                  + ", ".join(f"{k} {ours[k] - peer[k]:+.0f}{unit}" for k in diff))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=MODELS, default="smollm2-shape")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--rows", type=int, default=32, help="sequences decoded together")
    ap.add_argument("--prompt", type=int, default=128, help="prompt length in ids (no padding)")
    ap.add_argument("--short", type=int, default=8, help="tokens in the short run")
    ap.add_argument("--long", type=int, default=40, help="tokens in the long run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="also count profiler events per step")
    ap.add_argument("--profile-steps", type=int, default=4, help="extra steps the profile counts over (from 1)")
    ap.add_argument("--mask2d", action="store_true", help="also time ours with the other padding mask")
    ap.add_argument("--engine", action="store_true", help="also time ours through the rollout engine")
    ap.add_argument("--static", action="store_true", help="also time ours on the static cache (compiled on CUDA)")
    ap.add_argument("--graph", action="store_true",
                    help="also time ours with mas.decode=static_graph (a captured CUDA graph per step on CUDA)")
    ap.add_argument("--graph-only", action="store_true",
                    help="time only the static-graph side and the peer; end with the decode_rows<rows> line")
    ap.add_argument("--stop-check-every", type=int, default=8, help="--graph: host stop check every k tokens")
    args = ap.parse_args(argv)
    if args.rows < 1 or args.prompt < 2 or not 1 <= args.short < args.long or args.repeats < 1 \
            or args.profile_steps < 1 or args.stop_check_every < 1:
        ap.error("--rows >= 1, --prompt >= 2, 1 <= --short < --long, --repeats >= 1, --profile-steps >= 1 "
                 "and --stop-check-every >= 1 are needed")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available on this machine")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(min(2, torch.get_num_threads()))
    model, tok = build_policy(BenchSettings(model=args.model, device=args.device))
    gpu = f" gpu={torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""
    print(f"settings: model={args.model} device={args.device}{gpu} dtype={next(model.parameters()).dtype} "
          f"rows={args.rows} prompt={args.prompt} tokens {args.short} vs {args.long} repeats={args.repeats} "
          f"attention={getattr(model.config, '_attn_implementation', '?')}", flush=True)
    sides = make_sides(model, tok, args, device)
    times = {}
    for name, side in sides.items():
        t0 = time.perf_counter()
        times[name] = ms_per_step(side, device, args.short, args.long, args.repeats)
        pool = getattr(getattr(side, "decoder", None), "pool", None)
        graph = "" if pool is None else (f"; first capture {pool.capture_s:.2f} s, not in the step time"
                                         + (f" ({pool.capture_error}: ran eagerly)" if pool.capture_error else "")
                                         if pool.capture else "; eager (no CUDA graph on this device)")
        print(f"{name}: {times[name]:.2f} ms per decode step of {args.rows} rows, "
              f"{_tokens_per_s(args.rows, times[name]):.0f} tokens/s "
              f"({time.perf_counter() - t0:.0f} s with warm-up{graph})", flush=True)
    if args.profile:
        report_profiles({name: profile_step(side, device, 1, 1 + args.profile_steps)
                         for name, side in sides.items() if name in ("ours", "ours_engine", "peer")})
    if "ours_graph" in times and not args.graph_only:
        print(graph_check(sides["ours_graph"], model, tok, device), flush=True)
    if "ours_graph" in times:  # tokens/s at this many rows (bench/README.md's 128- and 512-row targets)
        print(ratio_line(f"decode_rows{args.rows}", _tokens_per_s(args.rows, times["ours_graph"]),
                         _tokens_per_s(args.rows, times["peer"]), "tokens/s", 1))
        if args.graph_only:
            return 0
        print(ratio_line("decode_step_graph", times["ours_graph"], times["peer"], "ms/step", 1))
    print(ratio_line("decode_step", times["ours"], times["peer"], "ms/step", 1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
