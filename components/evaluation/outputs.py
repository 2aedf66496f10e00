"""Every file of one evaluation, written into a (staging) folder: report.py's JSON and Markdown,
the per-item record and the two plots. :func:`components.evaluation.runner.evaluate` publishes the
folder as one set (publish.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.evaluation.items import ITEMS_FILE
from components.evaluation.metrics import EvalRow, SilenceGrid
from components.evaluation.plots import plot_accuracy_vs_tokens, plot_silence_heatmap
from components.evaluation.report import write_reports
from components.io import write_bytes_atomic


@dataclass(frozen=True)
class EvalOutputs:
    """What :func:`write_outputs` writes: the numbers, the rendered report, the main system's
    silence grid and the per-item record's bytes (hashed into ``meta`` as written)."""

    rows: Sequence[EvalRow]
    summary: dict[str, Any]
    meta: dict[str, Any]
    markdown: str
    grid: SilenceGrid | None
    items_bytes: bytes | None = None


def write_outputs(out_dir: Path, outputs: EvalOutputs) -> dict[str, Path]:
    """Every file of an evaluation into ``out_dir`` (report.py's layout); returns ``{name: path}``."""
    rows, summary, meta, markdown, grid, items_bytes = (outputs.rows, outputs.summary, outputs.meta,
                                                        outputs.markdown, outputs.grid, outputs.items_bytes)
    paths = write_reports(out_dir, rows, summary, meta, markdown)
    if items_bytes is not None:
        paths["items"] = out_dir / ITEMS_FILE
        write_bytes_atomic(paths["items"], items_bytes)
    paths["accuracy_vs_tokens"] = plot_accuracy_vs_tokens(rows, out_dir / "accuracy_vs_tokens.png")
    paths["silence_by_agent_round"] = plot_silence_heatmap(grid, out_dir / "silence_by_agent_round.png")
    return paths
