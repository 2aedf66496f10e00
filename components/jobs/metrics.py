"""Small numbers-only metric files for DVC (``--metrics FILE`` of prepare, train, evaluate, experiments report).

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

from components.io import write_json_atomic

EVAL_KEYS = ("accuracy", "accuracy_micro", "n", "tokens_total", "tokens_completion", "tokens_communicated",
             "silence_rate", "grading_errors")
TRAIN_KEYS = ("train/reward", "train/accuracy", "train/tokens_total", "train/tokens_completion", "train/budget_tokens",
              "train/budget", "train/lambda_tok", "train/silence_rate", "gspo/clip_frac_low", "gspo/clip_frac_high",
              "gspo/approx_kl", "gspo/grad_norm")
"""of the last step; the first step keeps the first five (where training started). ``perf/*`` (throughput,
seconds) changes run to run on the same inputs: not a metric to diff"""


def _numbers(value: Any, where: str) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _numbers(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"metrics {where}: {value!r} is not a finite number")
    return value


def write_metrics(path: str | Path, metrics: Mapping[str, Any]) -> Path:
    """Write ``metrics`` (nested mappings of finite numbers, checked) atomically as JSON."""
    target = Path(path)
    write_json_atomic(target, _numbers(metrics, target.name))
    return target


def data_metrics(manifest: Mapping[str, Any]) -> dict[str, int]:
    """Rows per benchmark (all splits) of a prepared-data manifest, and their total."""
    out = {name: sum(int(n) for n in (entry.get("rows") or {}).values())
           for name, entry in sorted(manifest.get("benchmarks", {}).items())}
    out["total_rows"] = sum(out.values())
    return out


def train_metrics(history: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """Steps run, :data:`TRAIN_KEYS` of the last step and the first five of them at the first step."""
    def pick(row: Mapping[str, float], keys: Sequence[str]) -> dict[str, float]:
        return {k: float(row[k]) for k in keys if isinstance(row.get(k), int | float) and math.isfinite(row[k])}

    if not history:
        return {"steps": 0}
    return {"steps": int(history[-1].get("step", len(history))), "first": pick(history[0], TRAIN_KEYS[:5]),
            "final": pick(history[-1], TRAIN_KEYS)}


def eval_metrics(summary: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Per evaluated system, its summary over benchmarks (:data:`EVAL_KEYS`, where defined)."""
    return {system: {k: s[k] for k in EVAL_KEYS if s.get(k) is not None} for system, s in summary.items()}
