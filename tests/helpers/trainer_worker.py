"""Worker launched by tests/integration/test_distributed_trainer.py: the GSPO trainer on 2 gloo ranks.

Every rank builds the tiny policy and the helper task of :mod:`helpers.learning_env`, then:

* ``--mode step``: runs one training step and writes ``rank<r>.json`` with the metrics it would
  log, its own episodes' metric rows and the mean of its own loss metrics (recorded per micro-batch);
* ``--mode guard``: builds the trainer with ``gspo.questions_per_step=1`` and writes the error it
  raised (or that none was raised, after trying a step).

Extra ``--set key=value`` arguments are params.yaml overrides. Run with ``tests`` on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from components.config import load_config
from components.errors import UserError
from components.gspo.step_batch import episode_row
from components.gspo.trainer import GSPOTrainer, seed_everything
from components.mas.engine import RolloutEngine
from components.mas.environment import Environment
from components.models.tiny import build_tiny_model
from components.runtime.distributed import init_distributed, shutdown_distributed
from components.runtime.engines import build_engine, planned_updates
from helpers.learning_env import ITEMS, helper_judge, set_marker_prior

BASE = ["model.name=tiny-random", "mas.agents=2", "mas.rounds=1", "mas.max_message_tokens=8", "mas.temperature=1.0",
        "gspo.engine=torch", "gspo.questions_per_step=4", "gspo.group_size=4", "gspo.minibatches=2",
        "gspo.lr=0.003", "reward.token_norm=8", "reward.lambda_rep=0"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("step", "guard"), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    info = init_distributed(timeout_s=120)
    record: dict = {"rank": info.rank, "world_size": info.world_size}
    try:
        extra = ["gspo.questions_per_step=1"] if args.mode == "guard" else []
        cfg = load_config(overrides=BASE + args.overrides + extra)
        seed_everything(cfg.gspo.seed + info.rank)
        model, tok = build_tiny_model(0)
        rollout = RolloutEngine(model, tok, cfg.mas)
        set_marker_prior(model, rollout, ITEMS, 0.3)  # some silence, so silence metrics differ by rank
        engine = build_engine(model, cfg.gspo, cfg.deepspeed, total_steps=planned_updates(cfg.gspo))
        try:
            trainer = GSPOTrainer(cfg, engine, Environment(rollout, helper_judge(0)), ITEMS, info,
                                  pad_id=int(tok.pad_token_id))
        except UserError as exc:
            record["error"] = str(exc)
        else:
            local: list[dict[str, float]] = []
            loss_fn = trainer.loss_fn

            def recording(*a, **k):
                out = loss_fn(*a, **k)
                local.append(out.metrics)
                return out

            trainer.loss_fn = recording
            res = trainer.train_step()
            record |= {"metrics": res.metrics,
                       "episodes": [episode_row(ep, cfg.reward.token_measure) for ep in res.episodes],
                       "tokens": sum(m.completion_tokens for ep in res.episodes for m in ep.messages),
                       "local_loss": {k: float(np.mean([m[k] for m in local])) for k in local[0]}}
    finally:
        shutdown_distributed()
    (args.out / f"rank{info.rank}.json").write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main())
