"""Evaluation plots (matplotlib, Agg backend: no display on servers and CI).

* ``accuracy_vs_tokens.png``: one subplot per benchmark, each system a point (x = mean total
  tokens per item, y = accuracy with its standard error), the Pareto front as a step line.
* ``silence_by_agent_round.png``: heatmap of the silence rate per agent (rows) and round
  (columns) for the MAS system, pooled over benchmarks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)

from components.evaluation.metrics import EvalRow, SilenceGrid, pareto_front  # noqa: E402
from components.io import atomic_path  # noqa: E402


def _save(fig, path: Path) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_accuracy_vs_tokens(rows: Sequence[EvalRow], path: str | Path) -> Path:
    """Scatter accuracy vs mean tokens per item per benchmark, with the Pareto front."""
    benchmarks = list(dict.fromkeys(r.benchmark for r in rows))
    systems = list(dict.fromkeys(r.system for r in rows))
    colours = {s: plt.get_cmap("tab10")(i % 10) for i, s in enumerate(systems)}
    # distinct markers, shrinking sizes: identical points (e.g. agent_gspo = mas_untrained before
    # training) stay visible as nested markers instead of hiding each other
    markers = {s: ("o", "s", "^", "D", "v", "P")[i % 6] for i, s in enumerate(systems)}
    sizes = {s: max(4.0, 11.0 - 2.0 * i) for i, s in enumerate(systems)}
    cols = min(4, max(1, len(benchmarks)))
    nrows = math.ceil(len(benchmarks) / cols) if benchmarks else 1
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 3.3 * nrows), squeeze=False)
    for ax, b in zip(axes.flat, benchmarks, strict=False):
        mine = [r for r in rows if r.benchmark == b]
        pts = [(r.tokens_total_mean, r.accuracy) for r in mine]
        for r in mine:
            ax.errorbar(r.tokens_total_mean, r.accuracy, yerr=r.accuracy_se, fmt=markers[r.system],
                        markersize=sizes[r.system], color=colours[r.system], label=r.system, capsize=3,
                        markerfacecolor="none" if r.system != systems[-1] else colours[r.system])
        front = pareto_front(pts)
        if len(front) > 1:
            ax.step([pts[i][0] for i in front], [pts[i][1] for i in front], where="post", color="grey",
                    linestyle="--", linewidth=1, label="Pareto front")
        ax.set_title(f"{b} (n={mine[0].n if mine else 0})")
        ax.set_xlabel("tokens per item (prompt + completion)")
        ax.set_ylabel("accuracy")
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(benchmarks):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), bbox_to_anchor=(0.5, -0.02))
    fig.suptitle("Accuracy vs token cost")
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    return _save(fig, Path(path))


def plot_silence_heatmap(grid: SilenceGrid | None, path: str | Path) -> Path:
    """Heatmap of silence rate, agents x rounds (an empty note when there is no MAS system)."""
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    if grid is None or not grid.total or not any(any(row) for row in grid.total):
        ax.text(0.5, 0.5, "no multi-agent messages", ha="center", va="center")
        ax.axis("off")
        return _save(fig, Path(path))
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
    return _save(fig, Path(path))
