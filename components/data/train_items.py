"""The training questions: the prepared ``data.train_sources`` less the items evaluation samples.

Here, below both training (:mod:`components.runtime.training_run`) and evaluation (the silence prior is
fitted on training questions), so neither imports the other (docs/architecture.md, "Layers").
"""

from __future__ import annotations

from pathlib import Path

from components.config import Config
from components.data.item import Item
from components.data.prepare import load_split
from components.data.sampling import EVAL_SPLIT, sample_items
from components.errors import UserError


def load_train_items(cfg: Config, data_dir: Path | None = None) -> list[Item]:
    """Training questions from the prepared parquet of ``data.train_sources`` ("bench/split").

    Never the items the evaluation samples: a source that is an evaluated split (``test`` of a
    benchmark in ``eval.benchmarks``) loses the ``eval.limit`` items ``eval.seed`` draws from it, so
    training on "the rest of HumanEval" cannot leak the items the results are measured on.
    """
    data_dir = Path(data_dir or cfg.data.out_dir)
    items: list[Item] = []
    for source in cfg.data.train_sources:
        if "/" not in source:
            raise UserError(f"data.train_sources: {source!r} must be 'benchmark/split' (e.g. gsm8k/train)")
        bench, split = source.split("/", 1)
        path = data_dir / bench / f"{split}.parquet"
        if not path.exists():
            raise UserError(f"data.train_sources: {path} not found; run `agent-gspo prepare` first")
        rows = load_split(data_dir, bench, split, cfg.data)
        if split == EVAL_SPLIT and bench in cfg.eval.benchmarks:
            held = {i.id for i in sample_items(rows, cfg.eval.limit, cfg.eval.seed, where=str(path))}
            rows = [i for i in rows if i.id not in held]
            if not rows:
                raise UserError(f"data.train_sources: {source!r} is evaluated whole (eval.limit="
                                f"{cfg.eval.limit!r}, eval.seed={cfg.eval.seed}): no item is left to train on")
        items.extend(rows)
    return items
