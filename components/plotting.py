"""The plotting helpers every PNG of the project shares (matplotlib, Agg backend: no display).

One saver (atomic, deterministic metadata), one accuracy-against-tokens chart (evaluation report,
experiments report), and one silence-per-agent-and-round panel (training plots, experiments
report), so the same quantity is always drawn the same way. The silence rate drawn over training
is the trainer's ``silence/agent{a}_round{r}``: silent messages / messages of that agent in that
round, over every episode of the step (all ranks).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)
from matplotlib.ticker import MaxNLocator  # noqa: E402

from components.io import atomic_path  # noqa: E402

History = Sequence[Mapping[str, float]]
SILENCE_KEY = re.compile(r"^silence/agent(\d+)_round(\d+)$")


@dataclass(frozen=True)
class Point:
    """One system on one benchmark (or ``mean``): x = total tokens per item, y = accuracy ± se."""

    system: str
    benchmark: str
    tokens_per_item: float
    accuracy: float
    se: float
    n: int | None = None


def save_png(fig: plt.Figure, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` atomically (no half-written PNG) with no software/date metadata, so
    the same numbers give the same bytes."""
    path = Path(path)
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return path


def empty(ax: plt.Axes, text: str) -> None:
    """A panel that says why it has nothing to show."""
    ax.text(0.5, 0.5, text, ha="center", va="center")
    ax.axis("off")


def series(history: History, key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of ``key`` in a training history (rows without the key skipped)."""
    pts = [(h["step"], h[key]) for h in history if key in h and "step" in h]
    return [p[0] for p in pts], [p[1] for p in pts]


def step_axis(ax: plt.Axes, ylabel: str, *, rate: bool = False, ncol: int = 1, legend: bool = True) -> None:
    """The x axis of a training curve (integer steps), its y label, grid and legend; ``rate`` fixes y to [0, 1]."""
    if rate:
        ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=7, ncol=ncol)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points (tokens, accuracy) not dominated by another, sorted by tokens.

    A point dominates another when it uses no more tokens and is at least as accurate, and is
    strictly better in one of the two. Ties (identical points) all stay on the front.
    """
    front = []
    for i, (xi, yi) in enumerate(points):
        dominated = any((xj <= xi and yj >= yi) and (xj < xi or yj > yi)
                        for j, (xj, yj) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: (points[i][0], -points[i][1]))


def plot_accuracy_vs_tokens(points: Sequence[Point], path: str | Path, *, title: str = "Accuracy vs token cost",
                            pareto: bool = True) -> Path:
    """One panel per benchmark: every system's accuracy (± se) against its tokens per item, and the
    Pareto front as a dashed step line. Markers are distinct and shrink with the system's index,
    so identical points (e.g. a policy before training and the untrained MAS) stay visible."""
    panels = list(dict.fromkeys(p.benchmark for p in points)) or ["(no results)"]
    systems = list(dict.fromkeys(p.system for p in points))
    colours = {s: plt.get_cmap("tab10")(i % 10) for i, s in enumerate(systems)}
    markers = {s: "osD^vP*Xh<>"[i % 11] for i, s in enumerate(systems)}
    sizes = {s: max(4.0, 11.0 - 1.5 * i) for i, s in enumerate(systems)}
    cols = min(4, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.3 * rows), squeeze=False)
    for ax, bench in zip(axes.flat, panels, strict=False):
        mine = [p for p in points if p.benchmark == bench]
        for p in mine:
            ax.errorbar(p.tokens_per_item, p.accuracy, yerr=p.se, fmt=markers[p.system], color=colours[p.system],
                        label=p.system, capsize=3, markersize=sizes[p.system],
                        markerfacecolor="none" if p.system != systems[-1] else colours[p.system])
        front = pareto_front([(p.tokens_per_item, p.accuracy) for p in mine]) if pareto else []
        if len(front) > 1:
            ax.step([mine[i].tokens_per_item for i in front], [mine[i].accuracy for i in front], where="post",
                    color="grey", linestyle="--", linewidth=1, label="Pareto front")
        n = mine[0].n if mine and mine[0].n is not None else None
        ax.set_title(bench if n is None else f"{bench} (n={n})")
        ax.set_xlabel("tokens per item (prompt + completion)")
        ax.set_ylabel("accuracy")
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if not points:
        empty(axes.flat[0], "no results")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), bbox_to_anchor=(0.5, -0.04))
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.07, 1, 0.96))
    return save_png(fig, path)


def draw_silence(ax: plt.Axes, history: History, title: str) -> bool:
    """One line per (agent, round) of ``silence/agent{a}_round{r}`` over training; False (and an
    explanatory panel) when the history has none."""
    keys = sorted({k for row in history for k in row if SILENCE_KEY.match(k)},
                  key=lambda k: tuple(int(x) for x in SILENCE_KEY.match(k).groups()))  # type: ignore[union-attr]
    if not keys:
        empty(ax, f"{title}: no silence metrics")
        return False
    for key in keys:
        agent, rnd = SILENCE_KEY.match(key).groups()  # type: ignore[union-attr]
        ax.plot(*series(history, key), marker=".", label=f"agent {agent}, round {rnd}")
    ax.set_title(title)
    step_axis(ax, "silence rate (silent / messages)", rate=True, ncol=2)
    return True


def plot_silence(histories: Mapping[str, History], path: str | Path) -> Path:
    """One panel per run, one line per (agent, round): the silence rate over training."""
    names = [n for n, h in histories.items() if any(SILENCE_KEY.match(k) for row in h for k in row)]
    cols = min(3, max(1, len(names)))
    rows = max(1, math.ceil(len(names) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        draw_silence(ax, histories[name], name)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    if not names:
        empty(axes.flat[0], "no training history")
    fig.suptitle("Silence rate per agent and round over training")
    fig.tight_layout()
    return save_png(fig, path)
