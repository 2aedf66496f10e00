"""The GSPO trainer end to end through DeepSpeed on one rank: a GPU readiness check with timings.

What runs is ``components.runtime.training_run.train``, as ``agent-gspo train`` runs it: the model is loaded
by ``load_policy`` from a folder (``model.dtype: auto``: bf16 on a bf16-capable GPU), wrapped in
the DeepSpeed engine (ZeRO-2 by default, config from ``deepspeed_config``), trained for
``--steps`` GSPO steps on multi-agent rollouts, checkpointed, and saved as the final model.
``--set mas.static_cache=true`` decodes with the static KV cache (compiled by ``torch.compile`` on
CUDA) and then also checks the static cache's logic on the trained policy: greedy 2-round
episodes decoded on the static cache (uncompiled, so exact) equal the dynamic cache's, with the
same prompt tokens served from shared heads and stored prefixes.

The model is a random-init ``LlamaForCausalLM`` of SmolLM2-135M's shape (``--model smollm2-shape``,
built here from its config, so no weights travel) or ``tiny-random``; the tokenizer is the tiny
ChatML one widened to the vocabulary (bench/common.py). Questions are GSM8K-like synthetic
ones unless ``data/gsm8k/train.parquet`` is prepared.

    python bench/gpu_train.py --device cuda                             # ZeRO-2, dynamic cache
    python bench/gpu_train.py --device cuda --set mas.static_cache=true
    python bench/gpu_train.py --device cpu --model tiny-random          # logic check

A random-init model gives every episode of a group the same reward (nobody is ever right; every
message runs to the token cap), so group-normalised advantages would be 0 and no gradient would
flow: the bench uses ``gspo.adv_norm=none`` (raw rewards, i.e. the token and turn penalties) to
push real gradients through the same code path. Checks (exit 1 when one fails): every step's
loss and gradient norm are finite, the final weights differ from the initial ones, the final
model folder reloads. Ends with
``gpu_train: <x> completion tokens/s, <s> s/step (...)``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

if __package__ in (None, ""):  # `python bench/gpu_train.py`: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import MODELS, BenchSettings, build_policy, load_questions  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", default="smollm2-shape", choices=MODELS)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--zero-stage", type=int, default=2, choices=(0, 1, 2, 3))
    ap.add_argument("--steps", type=int, default=3, help="GSPO steps; the first one is reported apart (warm-up)")
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--agents", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64, help="max tokens per message")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="extra section.key=value")
    ap.add_argument("--out", default=None, help="run folder (default: a temporary one)")
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error("--steps must be >= 2 (one warm-up step, then timed steps)")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available on this machine")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if args.out:
        return run(args, Path(args.out))
    with tempfile.TemporaryDirectory(prefix="gpu-train-") as tmp:  # the model folder: ~270 MB in bf16
        return run(args, Path(tmp))


def run(args: argparse.Namespace, work: Path) -> int:
    from components.config import load_config
    from components.runtime.training_run import train

    s = BenchSettings(model=args.model, device=args.device)
    model, tok = build_policy(s)  # bf16 on cuda, fp32 on cpu (what model.dtype auto loads)
    init = {k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()}
    model.save_pretrained(work / "init-model")
    tok.save_pretrained(work / "init-model")
    del model
    items, source = load_questions(args.questions * args.steps, "data")
    overrides = [
        f"model.name={work / 'init-model'}", f"model.cache_dir={work / 'cache'}", "gspo.engine=deepspeed",
        f"deepspeed.zero_stage={args.zero_stage}", "deepspeed.launcher=none", f"gspo.steps={args.steps}",
        f"gspo.questions_per_step={args.questions}", f"gspo.group_size={args.group}", "gspo.minibatches=2",
        f"gspo.checkpoint_every={args.steps}", "gspo.lr=1e-5", "gspo.adv_norm=none", f"mas.agents={args.agents}",
        f"mas.rounds={args.rounds}", f"mas.max_message_tokens={args.tokens}", "tracking.log_model=false",
        *args.overrides]
    cfg = load_config(Path(os.devnull), overrides=overrides)
    print(f"settings: {args.model} ({args.device}), ZeRO-{args.zero_stage}, {args.steps} steps x {args.questions} "
          f"questions x G={args.group}, {args.agents} agents x {args.rounds} rounds, <= {args.tokens} tokens/message, "
          f"static_cache={cfg.mas.static_cache}; questions: {source}", flush=True)
    steps: list[dict[str, float]] = []
    t0 = time.perf_counter()
    result = train(cfg, items=items, out_dir=work / "run", track=False,
                   on_step=lambda step, m: steps.append({"t": time.perf_counter() - t0} | m))
    failures = []
    for i, m in enumerate(steps):
        for key in ("gspo/loss", "gspo/grad_norm"):
            if not math.isfinite(m.get(key, float("nan"))):
                failures.append(f"step {i + 1}: {key}={m.get(key)}")
    from safetensors.torch import load_file

    final = load_file(str(result.final_model / "model.safetensors")) if result.final_model else {}
    changed = sum(not torch.equal(final[k].float(), init[k]) for k in final if k in init)
    if not final or changed == 0:
        failures.append(f"final model: {len(final)} tensors, {changed} changed by training")
    if cfg.mas.static_cache and result.final_model is not None:
        line, ok = static_vs_dynamic(cfg, result.final_model, items, args.device)
        print(line, flush=True)
        if not ok:
            failures.append("static cache decodes differently from the dynamic cache")
    timed = steps[1:]
    seconds = timed[-1]["t"] - steps[0]["t"]
    episodes = args.questions * args.group  # per step, all on this one rank
    tokens = sum(m["train/tokens_completion"] * episodes for m in timed)  # metric: mean per episode
    mem = f", peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if args.device == "cuda" else ""
    print(f"steps: first (warm-up) {steps[0]['t']:.1f} s; then " + ", ".join(
        f"{m['perf/step_s']:.1f} s (rollout {m['perf/rollout_tokens_per_s']:.0f} tok/s)" for m in timed) + mem)
    print(f"checks: {changed}/{len(final)} weight tensors changed in the final model; "
          + ("FAILED: " + "; ".join(failures) if failures else "all passed"), flush=True)
    print(f"gpu_train: {tokens / seconds:.0f} completion tokens/s, {seconds / len(timed):.2f} s/step "
          f"({args.model}, {args.device}, ZeRO-{args.zero_stage}, static_cache={cfg.mas.static_cache})")
    return 1 if failures else 0


LOGPROB_TOL = {torch.float32: 1e-3, torch.bfloat16: 0.1, torch.float16: 0.1}
"""Largest |log-prob difference| accepted between the two caches' equal greedy messages, by model dtype.
The two caches run different attention shapes (the static one attends over all its columns, masked),
so reductions round differently: in fp32 that stays near 1e-6 (4.8e-7 measured on CPU); in bf16
the logits themselves keep 8 significant bits, and the first H200 run measured 1.6e-2 on 16
equal messages. The ids must match exactly either way."""


def static_vs_dynamic(cfg, folder: Path, items: list, device: str) -> tuple[str, bool]:
    """Greedy 2-round episodes of the trained policy on the dynamic cache and on the static cache
    (uncompiled: compilation is what training exercised; this checks the cache logic exactly)."""
    from components.mas.decode import DecodeOptions, Decoder
    from components.mas.engine import RolloutEngine
    from components.models import load_policy

    model, tok = load_policy(str(folder), cache_dir=cfg.model.cache_dir, dtype=cfg.model.dtype, device=device,
                             silence_marker=cfg.mas.silence_marker)
    mas = cfg.mas.model_copy(update={"static_cache": False, "rounds": max(2, cfg.mas.rounds)})
    runs = []
    for static in (False, True):
        eng = RolloutEngine(model, tok, mas, device=device)
        eng.decoder = Decoder(model, eng.decoder.stops, device=device, options=DecodeOptions(static_cache=static))
        t0 = time.perf_counter()
        eps = eng.rollout(items[:2], 2, seed=0, greedy=True)
        runs.append(([(m.completion_ids, m.logprobs) for ep in eps for m in ep.messages],
                     eng.last_stats.prefix_tokens_reused, time.perf_counter() - t0))
    (dyn, dyn_reused, dyn_s), (sta, sta_reused, sta_s) = runs
    same = sum(a[0] == b[0] for a, b in zip(dyn, sta, strict=False))
    diff = max((abs(x - y) for a, b in zip(dyn, sta, strict=False) if a[0] == b[0] for x, y in zip(a[1], b[1],
                                                                                                 strict=True)),
               default=0.0)
    tol, dtype = LOGPROB_TOL[model.dtype], str(model.dtype).removeprefix("torch.")
    ok = len(dyn) == len(sta) == same and dyn_reused == sta_reused and diff < tol
    return (f"static_cache: {same}/{len(dyn)} greedy messages equal to the dynamic cache's (max |log-prob "
            f"difference| {diff:.1e}, tolerance {tol:g} in {dtype}); prompt tokens served from shared heads / "
            f"stored prefixes: {sta_reused} static, {dyn_reused} dynamic; rollout {sta_s:.2f} s static "
            f"(uncompiled), {dyn_s:.2f} s dynamic"), ok


if __name__ == "__main__":
    sys.exit(main())
