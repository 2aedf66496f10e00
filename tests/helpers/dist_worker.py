"""Worker launched by tests/integration/test_distributed_cpu.py under torchrun or the deepspeed launcher.

Each rank builds the tiny Llama from a *rank-dependent* seed (the engine must broadcast rank 0's
weights), wraps it in each requested engine in turn, runs 3 updates on its contiguous shard of a fixed
question list, gathers a hash of its full weights from every rank, then saves a checkpoint
collectively and reloads it into a fresh engine. Rank 0 writes ``result.json`` and each engine's final
weights (``<engine>/weights.pt``) for the test to compare against a single-process reference.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import transformers

from components.config import DeepSpeedConfig, GspoConfig
from components.runtime.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from components.runtime.distributed import all_gather_objects, dist_info, init_distributed, shard, shutdown_distributed
from components.runtime.engines import TrainEngine, build_engine

VOCAB, STEPS, ITEMS, SEQ = 64, 3, 8, 8


def tiny_model(seed: int) -> transformers.LlamaForCausalLM:
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg)


def dataset() -> torch.Tensor:
    """[ITEMS, SEQ] token ids, identical on every rank and in the test's reference."""
    return torch.randint(0, VOCAB, (ITEMS, SEQ), generator=torch.Generator().manual_seed(1234))


def step_items(step: int, rank: int, world: int) -> torch.Tensor:
    """This rank's rows for ``step``: 4 fresh items per step, contiguous shard per rank."""
    data = dataset()
    rows = [(step * 4 + i) % ITEMS for i in range(4)]
    return data[shard(rows, rank, world)]


def full_weights(engine: TrainEngine) -> dict[str, torch.Tensor]:
    with engine.gathered_parameters():
        return {k: v.detach().float().cpu().clone() for k, v in engine.module.state_dict().items()}


def digest(weights: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(weights):
        h.update(k.encode())
        h.update(weights[k].numpy().tobytes())
    return h.hexdigest()


def run_engine(kind: str, zero_stage: int, out: Path, grad_accum: int = 1) -> dict[str, Any] | None:
    """Train, gather, checkpoint and reload one engine; rank 0 returns the result record.

    With ``grad_accum`` > 1 each rank's rows are split into that many equal micro-batches, whose
    mean loss equals the one-batch loss, so the reference is the same."""
    t0 = time.perf_counter()
    info = dist_info()
    gspo = GspoConfig(engine=kind, lr=1e-2, grad_clip=1.0, grad_accum=grad_accum, lr_schedule="cosine",
                      warmup_steps=1)
    ds = DeepSpeedConfig(zero_stage=zero_stage)
    engine = build_engine(tiny_model(100 + info.rank), gspo, ds, total_steps=STEPS)
    start = digest(full_weights(engine))
    norms, losses = [], []
    engine.train()
    for step in range(STEPS):
        ids = step_items(step, info.rank, info.world_size).to(info.device)
        seen: list[float] = []

        def micro_loss(micro: torch.Tensor, seen: list[float] = seen) -> torch.Tensor:
            loss = engine.module(input_ids=micro, labels=micro).loss
            seen.append(float(loss.detach()))
            return loss

        micro = [(int(m.shape[0]), lambda m=m: micro_loss(m)) for m in ids.tensor_split(grad_accum)]
        norms.append(engine.update(micro))
        losses.append(sum(seen) / grad_accum)
    final = full_weights(engine)
    digests = all_gather_objects(digest(final))
    starts = all_gather_objects(start)

    ckpt = save_checkpoint(out, STEPS, engine, extra={"losses": losses}, keep=1)
    fresh = build_engine(tiny_model(999 + info.rank), gspo, ds, total_steps=STEPS)
    extra = load_checkpoint(latest_checkpoint(out) or ckpt, fresh)
    reloaded = all_gather_objects(digest(full_weights(fresh)))
    ranks_seen = all_gather_objects(info.rank)
    losses_all = all_gather_objects(losses)
    if not info.is_main:
        return None
    torch.save(final, out / "weights.pt")
    return {
        "engine": kind, "zero_stage": zero_stage, "grad_accum": grad_accum, "world_size": info.world_size,
        "ranks_seen": ranks_seen,
        "start_digests": starts, "final_digests": digests, "reloaded_digests": reloaded, "grad_norms": norms,
        "losses_per_rank": losses_all, "extra_loaded": extra, "optimizer_steps": fresh.optimizer_steps,
        "lr": fresh.lr, "checkpoint": str(ckpt), "seconds": time.perf_counter() - t0,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", default="torch,deepspeed:2",
                    help="comma list of torch | deepspeed:<zero stage>, optionally :<grad_accum> (torch:0:2)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--local_rank", type=int, default=None)  # the deepspeed launcher passes it
    args = ap.parse_args()
    t0 = time.perf_counter()
    specs = [s.split(":") for s in args.engines.split(",")]
    info = init_distributed(for_deepspeed=any(s[0] == "deepspeed" for s in specs), timeout_s=120)
    results = []
    try:
        for spec in specs:
            stage = int(spec[1]) if len(spec) > 1 else 0
            accum = int(spec[2]) if len(spec) > 2 else 1
            results.append(run_engine(spec[0], stage, args.out / "-".join(spec), accum))
    finally:
        shutdown_distributed()
    if info.is_main:
        env = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
        payload = {"results": results, "env": env, "seconds": time.perf_counter() - t0}
        (args.out / "result.json").write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
