"""Report figures (PNG, written atomically): accuracy vs tokens of every system, and training curves
of every trained experiment (λ_tok, tokens vs budget, reward, silence per agent and round).

Inputs are plain numbers from the results files, so the report stays a pure function of the
folder. Matplotlib's Agg backend: no display, no network. PNG metadata carries no timestamp, so
the same results give the same bytes on the same matplotlib version.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from components.plotting import History, Point, empty, plot_accuracy_vs_tokens, plot_silence, save_png

__all__ = ["Point", "plot_accuracy_vs_tokens", "plot_curves", "plot_role_silence", "plot_silence"]


def plot_curves(histories: Mapping[str, History], key: str, path: Path, *, ylabel: str, title: str,
                budgets: Mapping[str, float] | None = None) -> Path:
    """``key`` against step, one line per experiment; dashed lines at each experiment's budget B."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    drawn = False
    for i, (name, hist) in enumerate(histories.items()):
        pts = [(h["step"], h[key]) for h in hist if key in h and "step" in h]
        if not pts:
            continue
        colour = plt.get_cmap("tab10")(i % 10)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", color=colour, label=name)
        if budgets and name in budgets:
            ax.axhline(budgets[name], color=colour, linestyle="--", linewidth=1, label=f"{name}: B")
        drawn = True
    if not drawn:
        empty(ax, f"no training history with {key}")
    else:
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax.set_title(title)
    return save_png(fig, path)


def plot_role_silence(histories: Mapping[str, History], path: Path) -> Path:
    """Split-information runs: silence of the agents with / without the fact over training, one
    panel per run (``silence/informed``, ``silence/uninformed``) with the exploration rate."""
    names = [n for n, h in histories.items() if any("silence/uninformed" in row for row in h)]
    fig, axes = plt.subplots(1, max(1, len(names)), figsize=(4.6 * max(1, len(names)), 3.3), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        for key, label in (("silence/uninformed", "without the fact"), ("silence/informed", "with the fact"),
                           ("train/silence_prob", "P(silence first), mean")):
            pts = [(h["step"], h[key]) for h in histories[name] if key in h]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=label)
        ax.set_title(name)
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("silence rate")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if not names:
        empty(axes.flat[0], "no split-information training history")
    fig.suptitle("Silence of the agents with and without the private fact, over training")
    fig.tight_layout()
    return save_png(fig, path)
