"""Training MFU with DeepSpeed ZeRO-2 on a Qwen2.5-0.5B-shaped model (random init, no weights).

    MFU = 6 · N · tokens/s / peak

N is the number of parameters (tied input/output embedding counted once: the lookup costs no
FLOPs, the output projection does, so the 6N rule then covers every weight matmul; attention's
own score/value FLOPs are left out, as in the usual 6N convention, which slightly *under*-states
MFU). ``peak`` is measured in the same run with a bf16 matmul loop (n×n×n, 2n³ FLOPs each), so
the figure is relative to what this chip actually sustains, and both numbers are printed.

Workload: 16 sequences × 1024 tokens of random ids per optimizer step (causal-LM loss), ZeRO-2,
bf16 (fp32 master weights in DeepSpeed's ZeRO optimizer), torch AdamW (no JIT-built DeepSpeed
ops), one process. ``--device cpu --tiny`` runs the same code on a tiny Qwen2 in fp32 as a
logic check (DeepSpeed builds one small C++ op on first CPU use; cached in TORCH_EXTENSIONS_DIR).

    python bench/mfu.py --device cuda            # H200: < 2 minutes
    python bench/mfu.py --device cpu --tiny      # logic check

Ends with ``mfu: <p>% of <peak> TFLOP/s``.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

if __package__ in (None, ""):  # `python bench/mfu.py`: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import sync  # noqa: E402

QWEN25_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768, rope_theta=1_000_000.0,
                  rms_norm_eps=1e-6, tie_word_embeddings=True)
"""Qwen2.5-0.5B's architecture (its config.json)."""
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=1024, max_position_embeddings=512, tie_word_embeddings=True)


@dataclass
class MfuResult:
    params: int
    tokens_per_s: float
    step_s: float
    peak_tflops: float

    @property
    def model_tflops(self) -> float:
        return 6 * self.params * self.tokens_per_s / 1e12

    @property
    def mfu(self) -> float:
        return self.model_tflops / self.peak_tflops if self.peak_tflops > 0 else 0.0


def _tf(x: float) -> str:
    """TFLOP/s with 3 significant digits below 10 (CPU checks), one decimal above."""
    return f"{x:.1f}" if x >= 10 else f"{x:.3g}"


def measure_peak(device: torch.device, dtype: torch.dtype, n: int, iters: int = 10, warmup: int = 3) -> float:
    """Sustained matmul TFLOP/s: mean over ``iters`` products of two n×n matrices (after warm-up)."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    out = torch.empty(n, n, device=device, dtype=dtype)
    for _ in range(warmup):
        torch.matmul(a, b, out=out)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        torch.matmul(a, b, out=out)
    sync(device)
    return 2 * n**3 * iters / (time.perf_counter() - t0) / 1e12


def _init_single_process() -> None:
    """RANK/WORLD_SIZE/... for one process (without them DeepSpeed tries MPI discovery)."""
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.expanduser("~/.cache/agent-gspo/torch_extensions"))


def ds_config(seqs: int, micro: int, bf16: bool, zero_stage: int) -> dict:
    """The trainer's DeepSpeed config (``components.runtime.engines.deepspeed_config``: same precision and
    ZeRO settings as training), with this bench's micro-batch and accumulation."""
    from components.config import DeepSpeedConfig, GspoConfig
    from components.runtime.engines import deepspeed_config

    config = deepspeed_config(GspoConfig(grad_accum=seqs // micro, grad_clip=1.0),
                              DeepSpeedConfig(zero_stage=zero_stage), world_size=1, on_gpu=bf16,
                              dtype=torch.bfloat16 if bf16 else torch.float32)
    config.update({"train_micro_batch_size_per_gpu": micro, "train_batch_size": seqs})
    return config


def run(args: argparse.Namespace) -> MfuResult:
    _init_single_process()
    import deepspeed
    from transformers import Qwen2Config, Qwen2ForCausalLM

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    device = torch.device(args.device)
    on_cuda = device.type == "cuda"
    if on_cuda:  # set_device needs an index: "cuda" alone means the current device, 0 on one GPU
        device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
        torch.cuda.set_device(device)
    deepspeed.init_distributed(dist_backend="nccl" if on_cuda else "gloo", auto_mpi_discovery=False)
    try:
        dtype = torch.bfloat16 if on_cuda else torch.float32
        peak = measure_peak(device, dtype, args.matmul_n)
        print(f"peak: {_tf(peak)} TFLOP/s ({str(dtype).removeprefix('torch.')} matmul {args.matmul_n}^3, mean of 10)",
              flush=True)
        config = Qwen2Config(**(TINY if args.tiny else QWEN25_05B), attn_implementation="sdpa")
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
        if args.grad_ckpt:
            model.gradient_checkpointing_enable()
        n_params = sum(p.numel() for p in model.parameters())
        n_embed = model.get_input_embeddings().weight.numel()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=on_cuda)
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                               config=ds_config(args.seqs, args.micro_batch, on_cuda, args.zero_stage))
        print(f"model: {'tiny qwen2' if args.tiny else 'qwen2.5-0.5b shape'} (random init) N={n_params / 1e6:.1f}M "
              f"params ({(n_params - n_embed) / 1e6:.1f}M without the tied embedding), {args.seqs} seqs x "
              f"{args.seq_len} tokens/step, micro-batch {args.micro_batch}, ZeRO-{args.zero_stage}, "
              f"{'bf16' if on_cuda else 'fp32'}, grad-ckpt {'on' if args.grad_ckpt else 'off'}", flush=True)
        gen = torch.Generator(device=device).manual_seed(1)
        ids = torch.randint(0, config.vocab_size, (args.seqs, args.seq_len), device=device, generator=gen)

        def step() -> float:
            loss = torch.zeros((), device=device)
            for micro in ids.split(args.micro_batch):
                out = engine(input_ids=micro, labels=micro, use_cache=False)
                engine.backward(out.loss)
                engine.step()  # DeepSpeed applies the update at the accumulation boundary
                loss = out.loss.detach()
            return float(loss)

        for _ in range(args.warmup):
            step()
        sync(device)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        sync(device)
        seconds = time.perf_counter() - t0
        tokens = args.seqs * args.seq_len * args.steps
        mem = f", peak memory {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB" if on_cuda else ""
        print(f"train: {tokens / seconds:.0f} tokens/s ({seconds / args.steps:.3f} s/step over {args.steps} steps "
              f"after {args.warmup} warm-up; loss {loss:.3f}{mem})", flush=True)
        return MfuResult(n_params, tokens / seconds, seconds / args.steps, peak)
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny Qwen2, 4 x 64 tokens (CPU logic check)")
    ap.add_argument("--seqs", type=int, default=None, help="sequences per optimizer step (16; tiny: 4)")
    ap.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (1024; tiny: 64)")
    ap.add_argument("--micro-batch", type=int, default=None, help="sequences per forward (default: all)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--zero-stage", type=int, default=2, choices=(0, 1, 2, 3))
    ap.add_argument("--grad-ckpt", action="store_true")
    ap.add_argument("--matmul-n", type=int, default=None, help="peak matmul size (8192; tiny: 512)")
    args = ap.parse_args(argv)
    args.seqs = args.seqs or (4 if args.tiny else 16)
    args.seq_len = args.seq_len or (64 if args.tiny else 1024)
    args.micro_batch = args.micro_batch or args.seqs
    args.matmul_n = args.matmul_n or (512 if args.tiny else 8192)
    if args.seqs % args.micro_batch:
        ap.error(f"--seqs {args.seqs} must be a multiple of --micro-batch {args.micro_batch}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: CUDA is not available on this machine")
    if args.device == "cpu":
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    res = run(args)
    print(f"model FLOPs: 6 x {res.params / 1e6:.1f}M x {res.tokens_per_s:.0f} tokens/s = "
          f"{_tf(res.model_tflops)} TFLOP/s")
    print(f"mfu: {100 * res.mfu:.1f}% of {_tf(res.peak_tflops)} TFLOP/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
