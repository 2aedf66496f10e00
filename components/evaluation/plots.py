"""Evaluation plots (matplotlib, Agg backend: no display on servers and CI).

* ``accuracy_vs_tokens.png``: one subplot per benchmark, each system a point (x = mean total
  tokens per item, y = accuracy with its standard error), the Pareto front as a step line.
* ``silence_by_agent_round.png``: heatmap of the silence rate per agent (rows) and round
  (columns) for the MAS system, pooled over benchmarks.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt

from components.evaluation.metrics import EvalRow, SilenceGrid
from components.plotting import Point, save_png
from components.plotting import plot_accuracy_vs_tokens as _shared_plot


def plot_accuracy_vs_tokens(rows: Sequence[EvalRow], path: str | Path) -> Path:
    """Accuracy (± se) against mean total tokens per item, one panel per benchmark, Pareto front."""
    points = [Point(r.system, r.benchmark, r.tokens_total_mean, r.accuracy, r.accuracy_se, r.n) for r in rows]
    return _shared_plot(points, path)


def plot_silence_heatmap(grid: SilenceGrid | None, path: str | Path) -> Path:
    """Heatmap of silence rate, agents x rounds (an empty note when there is no MAS system)."""
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    if grid is None or not grid.total or not any(any(row) for row in grid.total):
        ax.text(0.5, 0.5, "no multi-agent messages", ha="center", va="center")
        ax.axis("off")
        return save_png(fig, path)
    rates = grid.rates()
    data = [[float("nan") if v is None else v for v in row] for row in rates]
    im = ax.imshow(data, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    for a, row in enumerate(rates):
        for r, v in enumerate(row):
            ax.text(r, a, "-" if v is None else f"{v:.2f}", ha="center", va="center",
                    color="white" if (v or 0) < 0.6 else "black")
    ax.set_xticks(range(len(rates[0])), [f"round {r + 1}" for r in range(len(rates[0]))])
    ax.set_yticks(range(len(rates)), [f"agent {a + 1}" for a in range(len(rates))])
    ax.set_title(f"Silence rate: {grid.system}")
    fig.colorbar(im, ax=ax, label="silent / messages")
    fig.tight_layout()
    return save_png(fig, path)
