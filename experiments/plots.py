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

from components.plotting import (
    History,
    Point,
    empty,
    plot_accuracy_vs_tokens,
    plot_silence,
    save_png,
    series,
    step_axis,
)

__all__ = ["Point", "plot_accuracy_vs_tokens", "plot_curves", "plot_role_silence", "plot_silence"]


def plot_curves(histories: Mapping[str, History], key: str, path: Path, *, ylabel: str, title: str,
                budgets: Mapping[str, float] | None = None) -> Path:
    """``key`` against step, one line per experiment; dashed lines at each experiment's budget B."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    drawn = False
    for i, (name, hist) in enumerate(histories.items()):
        steps, values = series(hist, key)
        if not steps:
            continue
        colour = plt.get_cmap("tab10")(i % 10)
        ax.plot(steps, values, marker=".", color=colour, label=name)
        if budgets and name in budgets:
            ax.axhline(budgets[name], color=colour, linestyle="--", linewidth=1, label=f"{name}: B")
        drawn = True
    if not drawn:
        empty(ax, f"no training history with {key}")
    else:
        step_axis(ax, ylabel)
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
            ax.plot(*series(histories[name], key), marker=".", label=label)
        ax.set_title(name)
        step_axis(ax, "silence rate", rate=True)
    if not names:
        empty(axes.flat[0], "no split-information training history")
    fig.suptitle("Silence of the agents with and without the private fact, over training")
    fig.tight_layout()
    return save_png(fig, path)
