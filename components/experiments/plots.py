"""Report figures (PNG, written atomically): accuracy vs tokens of every system, and training curves
of every trained experiment (λ_tok, tokens vs budget, reward, silence per agent and round).

Inputs are plain numbers from the results files, so the report stays a pure function of the
folder. Matplotlib's Agg backend: no display, no network. PNG metadata carries no timestamp, so
the same results give the same bytes on the same matplotlib version.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from components.io import atomic_path  # noqa: E402

History = Sequence[Mapping[str, float]]
_SILENCE = re.compile(r"^silence/agent(\d+)_round(\d+)$")


@dataclass
class Point:
    """One system on one benchmark (or ``mean``): x = tokens per item, y = accuracy ± se."""

    system: str
    benchmark: str
    tokens_per_item: float
    accuracy: float
    se: float


def _save(fig: plt.Figure, path: Path) -> Path:
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return path


def _empty(ax: plt.Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center")
    ax.axis("off")


def plot_accuracy_vs_tokens(points: Sequence[Point], path: Path) -> Path:
    """One panel per benchmark plus ``mean``: accuracy (± se) against tokens per item, every system."""
    panels = list(dict.fromkeys(p.benchmark for p in points)) or ["(no results)"]
    systems = list(dict.fromkeys(p.system for p in points))
    colours = {s: plt.get_cmap("tab10")(i % 10) for i, s in enumerate(systems)}
    markers = {s: "osD^vP*Xh<>"[i % 11] for i, s in enumerate(systems)}
    cols = min(4, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.3 * rows), squeeze=False)
    for ax, bench in zip(axes.flat, panels, strict=False):
        for p in (p for p in points if p.benchmark == bench):
            ax.errorbar(p.tokens_per_item, p.accuracy, yerr=p.se, fmt=markers[p.system], color=colours[p.system],
                        label=p.system, capsize=3, markersize=7)
        ax.set_title(bench)
        ax.set_xlabel("total tokens per item")
        ax.set_ylabel("accuracy")
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if not points:
        _empty(axes.flat[0], "no results")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), bbox_to_anchor=(0.5, -0.04))
    fig.suptitle("Accuracy vs token cost (every system, same items)")
    fig.tight_layout(rect=(0, 0.07, 1, 0.96))
    return _save(fig, path)


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
        _empty(ax, f"no training history with {key}")
    else:
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax.set_title(title)
    return _save(fig, path)


def plot_silence(histories: Mapping[str, History], path: Path) -> Path:
    """One panel per trained experiment, one line per (agent, round): silence rate over training."""
    names = [n for n, h in histories.items() if any(_SILENCE.match(k) for row in h for k in row)]
    cols = min(3, max(1, len(names)))
    rows = max(1, math.ceil(len(names) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.3 * cols, 3.2 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        hist = histories[name]
        keys = sorted({k for row in hist for k in row if _SILENCE.match(k)},
                      key=lambda k: tuple(int(x) for x in _SILENCE.match(k).groups()))  # type: ignore[union-attr]
        for key in keys:
            agent, rnd = _SILENCE.match(key).groups()  # type: ignore[union-attr]
            pts = [(h["step"], h[key]) for h in hist if key in h]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=f"agent {agent}, round {rnd}")
        ax.set_title(name)
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("silence rate")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    if not names:
        _empty(axes.flat[0], "no training history")
    fig.suptitle("Silence rate per agent and round over training")
    fig.tight_layout()
    return _save(fig, path)


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
        _empty(axes.flat[0], "no split-information training history")
    fig.suptitle("Silence of the agents with and without the private fact, over training")
    fig.tight_layout()
    return _save(fig, path)
