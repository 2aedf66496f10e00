"""Small numbers-only metric files for DVC (``--metrics`` of prepare, train, evaluate (a folder), experiments report).

``dvc metrics show / diff`` and ``dvc exp show`` flatten every leaf of a metrics file into a
column, so these files hold only the headline numbers (no hashes, paths, names or nulls), and
they are tracked in git (``cache: false``) so experiments and commits can be compared. The full
outputs (manifest, per-benchmark tables, results files) stay where they are, as outputs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from components.io import write_json_atomic, write_text_atomic
from components.numbers import is_finite_number

COLUMNS = ("n", "accuracy", "tokens", "silence", "reward", "lambda_tok", "budget", "noop")
"""The one small vocabulary of every smoke-chain metrics file, one file per row.

``dvc metrics show`` prints ONE table: a row per file and a column per distinct leaf key of all
files. Files with disjoint, nested keys made it 4,082 characters wide; files that share these
eight keys (``n``: rows, steps or items; ``tokens``: mean total tokens per episode; ``budget``:
the token budget B; ``noop``: steps whose update changed nothing) keep it under 120 columns,
and ``dvc metrics diff`` compares like with like. Everything else is in the stage's outputs
(manifest, history.csv, evaluation tables)."""

SERIES_COLUMNS = {"step": "step", "reward": "train/reward", "accuracy": "train/accuracy",
                  "tokens": "train/tokens_total", "budget_tokens": "train/budget_tokens", "budget": "train/budget",
                  "lambda_tok": "train/lambda_tok", "silence": "train/silence_rate",
                  "zero_adv_groups_frac": "gspo/zero_adv_groups_frac", "grad_norm": "gspo/grad_norm",
                  "loss": "gspo/loss", "approx_kl": "gspo/approx_kl"}
"""the per-step training series (``history.csv`` in the run folder, a DVC plot with x = step):
column -> history key"""
SERIES_FILE = "history.csv"

DIGITS = 4
"""metrics are rounded: 5 significant decimals of a mean of 2 episodes are noise, and width"""


def _numbers(value: Any, where: str) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _numbers(v, f"{where}.{k}") for k, v in value.items()}
    if not is_finite_number(value):
        raise ValueError(f"metrics {where}: {value!r} is not a finite number")
    return value


def write_metrics(path: str | Path, metrics: Mapping[str, Any]) -> Path:
    """Write ``metrics`` (nested mappings of finite numbers, checked) atomically as JSON."""
    target = Path(path)
    write_json_atomic(target, _numbers(metrics, target.name))
    return target


def _round(value: float) -> float | int:
    return value if isinstance(value, int) else round(float(value), DIGITS)


def data_metrics(manifest: Mapping[str, Any]) -> dict[str, int]:
    """``n``: rows of every prepared benchmark and split (per benchmark: data/manifest.json)."""
    return {"n": sum(int(n) for entry in manifest.get("benchmarks", {}).values()
                     for n in (entry.get("rows") or {}).values())}


def train_metrics(history: Sequence[Mapping[str, float]]) -> dict[str, float | int]:
    """Steps run (``n``), the last step's numbers and how many steps were no-ops (:data:`COLUMNS`)."""
    if not history:
        return {"n": 0}
    last = history[-1]
    keys = {"accuracy": "train/accuracy", "tokens": "train/tokens_total", "silence": "train/silence_rate",
            "reward": "train/reward", "lambda_tok": "train/lambda_tok", "budget": "train/budget"}
    out: dict[str, float | int] = {"n": int(last.get("step", len(history)))}
    out |= {col: _round(last[k]) for col, k in keys.items()
            if isinstance(last.get(k), int | float) and math.isfinite(last[k])}
    out["noop"] = sum(int(row.get("gspo/noop_step", 0.0) > 0) for row in history)
    return out


def eval_metrics(summary: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float | int]]:
    """Per evaluated system (one file each), ``n`` items, accuracy, mean tokens per episode, silence."""
    keys = {"n": "n", "accuracy": "accuracy", "tokens": "tokens_total_mean", "silence": "silence_rate"}
    return {system: {col: _round(s[k]) for col, k in keys.items() if s.get(k) is not None}
            for system, s in summary.items()}


def write_eval_metrics(folder: str | Path, summary: Mapping[str, Mapping[str, Any]]) -> list[Path]:
    """One file per system, ``<folder>/<system>.json`` (a row each in ``dvc metrics show``); files of
    systems not evaluated now are removed, so the folder is this evaluation's."""
    target = Path(folder)
    rows = eval_metrics(summary)
    written = [write_metrics(target / f"{system}.json", row) for system, row in rows.items()]
    for stale in target.glob("*.json"):
        if stale.stem not in rows:
            stale.unlink()
    return written


def write_series(path: str | Path, history: Sequence[Mapping[str, float]]) -> Path:
    """The per-step training series as CSV (:data:`SERIES_COLUMNS`; empty cells where a step lacks one)."""
    import csv
    import io


    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(SERIES_COLUMNS)
    for row in history:
        writer.writerow(["" if not isinstance(row.get(k), int | float) else
                         int(row[k]) if col == "step" else _round(row[k]) for col, k in SERIES_COLUMNS.items()])
    target = Path(path)
    write_text_atomic(target, buf.getvalue())
    return target
