"""GSPO training-step throughput: our trainer vs TRL's ``GRPOTrainer`` in GSPO mode, same work.

Both sides train the same single-agent configuration from identical initial weights:

* same model shape (``tiny-random``: 2-layer hidden-64 Llama; ``smollm2-shape``: a random-init
  ``LlamaForCausalLM`` with SmolLM2-135M's config, no weights needed), same tokenizer;
* the same Q GSM8K questions per step (prepared ``data/gsm8k/train.parquet`` when present, else
  GSM8K-like synthetic ones) under the same system + user chat prompt, G completions each;
* every completion exactly ``--tokens`` long (ours: ``min_new_tokens`` masks EOS; TRL:
  ``generation_kwargs={"min_new_tokens": T}`` with ``max_completion_length=T``), T=1, top-p 1, no top-k;
* GSPO: sequence-level ratio, ε 3e-4 / 4e-4, β=0, FOUR optimizer mini-batches per generation batch
  (ours ``gspo.minibatches=4``; TRL ``steps_per_generation=4``, ``gradient_accumulation_steps=1``,
  ``num_iterations=1``, so TRL also recomputes π_old once per generation batch), AdamW with the
  same lr, constant schedule, grad clip 1, no gradient checkpointing on either side (TRL's
  default is on; that would only measure recomputation);
* a cheap text reward on both sides (parity of the letter count, so advantages are not all zero).

Each side runs one warm-up step (one generation batch + its 4 updates), then ``--steps`` timed
steps. Throughput = generated completion tokens / wall time of the timed steps, generation
included. On ``--device cuda`` both sides run in bf16 and the GPU name is printed.

    python bench/train_step.py [--model tiny-random|smollm2-shape] [--device cpu|cuda]
                               [--questions 4] [--group 8] [--tokens 128] [--steps 3]

Ends with ``bench train_step: ours <x> tokens/s, peer <y> tokens/s, ratio <r>x (target 1.5x)``;
exits 0 even when the target is missed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

if __package__ in (None, ""):  # `python bench/train_step.py`: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    MODELS,
    BenchSettings,
    SideResult,
    _n,
    build_policy,
    letter_parity_reward,
    load_questions,
    ratio_line,
    sync,
)
from components.data.item import Item  # noqa: E402
from components.errors import UserError  # noqa: E402

TARGET = 1.5
DECODE = os.environ.get("BENCH_DECODE", "dynamic")
"""our side's ``mas.decode`` (``--decode``; the child process reads it from the environment)"""
PEERS = ("trl", "trl_cb")
"""TRL's default generation (``model.generate``) and its transformers continuous batching
(``GRPOConfig.use_transformers_continuous_batching``)"""


class PhaseClock:
    """Wall seconds inside wrapped methods (device-synchronised), and the peak memory of the timed steps."""

    def __init__(self, device: str) -> None:
        self.device, self.seconds = device, {}
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()

    def wrap(self, obj, name: str, key: str) -> None:
        inner = getattr(obj, name)
        self.seconds[key] = 0.0

        def timed(*a, **k):
            sync(self.device)
            t0 = time.perf_counter()
            out = inner(*a, **k)
            sync(self.device)
            self.seconds[key] += time.perf_counter() - t0
            return out

        setattr(obj, name, timed)

    def report(self) -> dict:
        if self.device.startswith("cuda"):
            peak = torch.cuda.max_memory_allocated() / 2**30
        else:
            import resource

            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB (host RSS)
        return self.seconds | {"peak_gib": peak}

# ----------------------------------------------------------------------------- ours

def _in_order_sampler() -> type:
    from components.gspo.trainer import QuestionSampler

    class InOrderSampler(QuestionSampler):
        """Hands out items in list order (bench only): step k gets items k*Q..k*Q+Q-1, exactly
        the prompts TRL's unshuffled RepeatSampler gives its k-th generation batch."""

        def next_batch(self, n: int) -> list[Item]:
            out = [self.items[(self.cursor + i) % len(self.items)] for i in range(n)]
            self.cursor += n
            return out

    return InOrderSampler


def run_ours(s: BenchSettings, items: list[Item]) -> SideResult:
    """Our GSPOTrainer: single_cot engine (1 agent, 1 round), TorchEngine, 4 mini-batches."""
    from components.config import Config
    from components.gspo.trainer import GSPOTrainer, seed_everything
    from components.mas.baselines import single_cot_engine
    from components.mas.calls import EngineOptions
    from components.mas.environment import Environment
    from components.runtime.distributed import DistInfo
    from components.runtime.engines import build_engine
    from components.scoring.result import ScoreResult

    InOrderSampler = _in_order_sampler()

    cfg = Config.model_validate({
        "model": {"name": s.model},
        "mas": {"agents": 1, "rounds": 1, "max_message_tokens": s.tokens, "temperature": s.temperature,
                "top_p": 1.0, "decode": DECODE, "stop_check_every": 8 if DECODE == "static_graph" else 1},
        "gspo": {"engine": "torch", "steps": s.steps + 1, "questions_per_step": s.questions, "group_size": s.group,
                 "minibatches": s.minibatches, "eps_low": 3e-4, "eps_high": 4e-4, "level": "sequence",
                 "kl_beta": 0.0, "lr": s.lr, "lr_schedule": "constant", "grad_clip": 1.0, "grad_accum": 1,
                 "seed": s.seed, "log_kl_base": False},  # β=0: neither side keeps a reference model
    })
    seed_everything(s.seed)
    model, tok = build_policy(s)
    engine = build_engine(model, cfg.gspo, cfg.deepspeed, total_steps=cfg.gspo.steps * cfg.gspo.minibatches)
    rollout = single_cot_engine(engine.module, tok, cfg.mas, device=s.device,
                                options=EngineOptions(min_new_tokens=s.tokens))

    def judge(items: list[Item], episodes: list) -> None:  # the reward TRL's side gets: the message itself
        for ep in episodes:
            ep.grade = ScoreResult(letter_parity_reward(ep.messages[0].text) > 0, None, None)

    trainer = GSPOTrainer(cfg, engine, Environment(rollout, judge), items,
                          DistInfo(rank=0, world_size=1, local_rank=0, is_main=True), pad_id=int(tok.pad_token_id))
    trainer.sampler = InOrderSampler(items, s.seed)  # the questions TRL sees (shuffle_dataset=False), in order
    gc.freeze()  # as components.runtime.training_run.train does before its first step
    trainer.train_step()  # warm-up: allocator, kernels, tokenizer caches, graph capture
    sync(s.device)
    phases = PhaseClock(s.device)
    phases.wrap(trainer, "_old_logprobs", "pi_old_s")
    phases.wrap(engine, "update", "update_s")
    phases.wrap(engine.optimizer, "step", "optimizer_s")
    tokens, gen_s, rewards, prompt_lens, calls, decode_steps = 0, 0.0, [], [], 0, 0
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(s.steps):
        res = trainer.train_step()
        tokens += sum(m.completion_tokens for ep in res.episodes for m in ep.messages)
        gen_s += rollout.last_stats.generate_s
        calls += rollout.last_stats.calls  # one per round wave; its prompt-length buckets add decode steps
        decode_steps += rollout.last_stats.decode_steps
        rewards.append(res.metrics["train/accuracy"])
        prompt_lens += [len(ep.messages[0].prompt_ids) for ep in res.episodes[:: s.group]]
    sync(s.device)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    return SideResult("ours", tokens, seconds, s.steps, s.steps * s.minibatches, cpu_seconds,
                      {"generate_s": gen_s, "decode_calls": calls, "decode_steps": decode_steps,
                       "mean_prompt_tokens": sum(prompt_lens) / len(prompt_lens),
                       "mean_reward": sum(rewards) / len(rewards), "optimizer_updates": engine.optimizer_steps,
                       "decode": DECODE} | phases.report())


# ----------------------------------------------------------------------------- main

def parse_args(argv: list[str] | None) -> tuple[BenchSettings, str, str | None, list[str]]:
    global DECODE
    d = BenchSettings()
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", default=d.model, choices=MODELS)
    ap.add_argument("--device", default=d.device)
    ap.add_argument("--questions", type=int, default=d.questions)
    ap.add_argument("--group", type=int, default=d.group)
    ap.add_argument("--tokens", type=int, default=d.tokens)
    ap.add_argument("--minibatches", type=int, default=d.minibatches)
    ap.add_argument("--steps", type=int, default=d.steps)
    ap.add_argument("--lr", type=float, default=d.lr)
    ap.add_argument("--temperature", type=float, default=d.temperature)
    ap.add_argument("--threads", type=int, default=d.threads)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--data", dest="data_dir", default=d.data_dir)
    ap.add_argument("--repeats", type=int, default=d.repeats,
                    help="alternate ours/peer this many times and keep each side's best run (shared CPUs are noisy)")
    ap.add_argument("--side", choices=("both", "ours", *PEERS), default="both",
                    help="both (default) runs each side in its own child process")
    ap.add_argument("--peers", default="trl", help=f"comma-separated peers from {','.join(PEERS)} (default trl)")
    ap.add_argument("--decode", choices=("dynamic", "static_graph"), default=DECODE, help="our side's mas.decode")
    ap.add_argument("--result-file", default=None, help=argparse.SUPPRESS)
    ns = vars(ap.parse_args(argv))
    from bench.common import BenchInputError
    side, result_file, peers = ns.pop("side"), ns.pop("result_file"), ns.pop("peers").split(",")
    os.environ["BENCH_DECODE"] = ns.pop("decode")
    bad = [p for p in peers if p not in PEERS]
    if bad:
        raise BenchInputError(f"--peers: unknown peer {bad[0]!r} (peers: {', '.join(PEERS)})")
    s = BenchSettings(**ns)
    s.validate()
    DECODE = os.environ["BENCH_DECODE"]
    return s, side, result_file, peers


def run_side(s: BenchSettings, side: str, result_file: str) -> None:
    """Child process: run one side and write its :class:`SideResult` as JSON."""
    if s.device == "cpu":
        torch.set_num_threads(s.threads)
    items, _ = load_questions(s.questions * (s.steps + 1), s.data_dir)
    if side == "ours":
        res = run_ours(s, items)
    else:
        from bench._trl_peer import run_trl  # imported late: trl + accelerate take seconds to import

        res = run_trl(s, items, continuous_batching=side == "trl_cb")
    Path(result_file).write_text(json.dumps(asdict(res)))


def spawn_side(argv: list[str], side: str, s: BenchSettings) -> SideResult:
    """Run one side in a fresh interpreter.

    Why a process each: our TorchEngine fills RANK/WORLD_SIZE/MASTER_* (the launcher contract);
    in the same process accelerate would then see a "distributed" CPU job and wrap TRL's model in
    a 1-rank DDP with gloo all-reduces and reset the thread count, which is not TRL's normal
    single-process cost. Separate processes also keep allocator state and imports apart.
    """
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    if s.device == "cpu":
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(s.threads)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with tempfile.TemporaryDirectory(prefix="bench-train-step-") as tmp:
        out = Path(tmp) / f"{side}.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--side", side, "--result-file", str(out)]
        proc = subprocess.run(cmd, env=env, cwd=os.getcwd(), check=False)
        if proc.returncode != 0 or not out.is_file():
            raise RuntimeError(f"{side} side failed (exit {proc.returncode}); see its output above")
        return SideResult(**json.loads(out.read_text()))


def _side_line(r: SideResult) -> str:
    d = r.detail
    extra = f" [trl {d['trl_version']}]" if "trl_version" in d else ""
    if d.get("decode_steps"):  # where ours spends its generation time (the H200 question, bench/README.md)
        extra += (f"; {d['decode_calls']} decode calls, {d['decode_steps']} decode steps, "
                  f"{d['generate_s'] / d['decode_steps'] * 1e3:.1f} ms per step with the prefill")
    return (f"{r.name}: {r.tokens} tokens in {r.seconds:.2f}s over {r.steps} steps ({r.optimizer_steps} optimizer "
            f"updates; generate {d['generate_s']:.2f}s), {_n(r.tokens_per_s)} tokens/s "
            f"({_n(r.tokens_per_cpu_s)} per CPU-s), prompt "
            f"{d['mean_prompt_tokens']:.0f} tokens, mean reward {d['mean_reward']:.2f}{extra}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    for key, value in (("HF_HUB_OFFLINE", "1"), ("HF_HUB_DISABLE_TELEMETRY", "1"), ("DO_NOT_TRACK", "1"),
                       ("TOKENIZERS_PARALLELISM", "false"), ("HF_HUB_DISABLE_PROGRESS_BARS", "1")):
        os.environ.setdefault(key, value)
    try:
        s, side, result_file, peers = parse_args(argv)
    except UserError as exc:
        print(f"bench train_step: error: {exc}", file=sys.stderr)
        return exc.exit_code
    if side != "both":
        if result_file is None:
            print("bench train_step: error: --side needs --result-file", file=sys.stderr)
            return 2
        run_side(s, side, result_file)
        return 0
    _, source = load_questions(s.questions * (s.steps + 1), s.data_dir)
    gpu = f" gpu={torch.cuda.get_device_name(s.device)}" if s.device.startswith("cuda") else ""
    print(f"settings: model={s.model} device={s.device}{gpu} dtype={str(s.dtype).removeprefix('torch.')} "
          f"threads={s.threads if s.device == 'cpu' else '-'} prompts/step={s.questions} G={s.group} "
          f"completions/step={s.completions} tokens/completion={s.tokens} (fixed) minibatches/step={s.minibatches} "
          f"warmup=1 timed_steps={s.steps} lr={s.lr} T={s.temperature} eps=3e-4/4e-4 beta=0 level=sequence",
          flush=True)
    print(f"prompts: {source}, the same questions in the same order on both sides", flush=True)
    sides = ["ours", *peers]
    runs: dict[str, list[SideResult]] = {k: [] for k in sides}
    for r in range(s.repeats):
        for side in sides:
            runs[side].append(spawn_side(argv, side, s))
            print(f"run {r + 1}/{s.repeats} " + _side_line(runs[side][-1]), flush=True)
    best = {k: max(runs[k], key=lambda x: x.tokens_per_s) for k in sides}
    for k in sides:
        print("best " + _side_line(best[k]))
    ours = best["ours"]
    print("ours phases (timed steps): " + ", ".join(
        f"{k.removesuffix('_s')} {ours.detail[k]:.2f} s" for k in ("update_s", "pi_old_s", "optimizer_s"))
        + f", generate {ours.detail['generate_s']:.2f} s; peak memory {ours.detail['peak_gib']:.2f} GiB"
        + (" (GPU allocated)" if s.device.startswith("cuda") else " (host RSS)"))
    for peer_name in peers:
        peer = best[peer_name]
        if ours.tokens != peer.tokens:
            print(f"warning: completion token counts differ (ours {ours.tokens}, {peer_name} {peer.tokens})")
        if s.device == "cpu":
            o_cpu, p_cpu = (max(r.tokens_per_cpu_s for r in runs[k]) for k in ("ours", peer_name))
            print(f"cpu-time view vs {peer_name} (best per side; less sensitive to other load): ours {_n(o_cpu)}, "
                  f"peer {_n(p_cpu)} tokens per CPU-second, ratio {o_cpu / max(p_cpu, 1e-9):.2f}x")
        name = "train_step" if peer_name == "trl" else f"train_step_{peer_name}"
        print(ratio_line(name, ours.tokens_per_s, peer.tokens_per_s, "tokens/s", TARGET if peer_name == "trl" else 1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
