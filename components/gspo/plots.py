"""Training plots (PNG): reward/accuracy, tokens vs budget, λ_tok, silence per agent and round.

Each function takes the trainer's per-step history (a list of metric dicts with ``step``) and
writes one PNG atomically. Matplotlib's Agg backend: no display, no network.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from components.io import atomic_path  # noqa: E402

History = Sequence[dict[str, float]]
_SILENCE = re.compile(r"^silence/agent(\d+)_round(\d+)$")


def _series(history: History, key: str) -> tuple[list[float], list[float]]:
    pts = [(h["step"], h[key]) for h in history if key in h]
    return [p[0] for p in pts], [p[1] for p in pts]


def _save(fig: plt.Figure, path: Path) -> Path:
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_reward_accuracy(history: History, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for key, label in (("train/reward", "reward"), ("train/accuracy", "accuracy")):
        ax.plot(*_series(history, key), marker=".", label=label)
    ax.set_xlabel("step")
    ax.set_title("Reward and team accuracy")
    ax.legend()
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_tokens_budget(history: History, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(*_series(history, "train/budget_tokens"), marker=".", label="mean tokens / episode (budget measure)")
    ax.plot(*_series(history, "train/budget"), linestyle="--", color="k", label="budget B")
    ax.plot(*_series(history, "train/tokens_communicated"), marker=".", alpha=0.6, label="communicated tokens")
    ax.set_xlabel("step")
    ax.set_ylabel("tokens")
    ax.set_title("Token use against the budget")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_lambda(history: History, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 3.0))
    ax.plot(*_series(history, "train/lambda_tok"), marker=".", color="tab:red")
    ax.set_xlabel("step")
    ax.set_ylabel("λ_tok")
    ax.set_title("Dual variable λ_tok")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_silence(history: History, path: Path) -> Path:
    """One line per (agent, round): silence rate over training."""
    keys = sorted({k for h in history for k in h if _SILENCE.match(k)},
                  key=lambda k: tuple(int(x) for x in _SILENCE.match(k).groups()))  # type: ignore[union-attr]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for key in keys:
        agent, rnd = _SILENCE.match(key).groups()  # type: ignore[union-attr]
        ax.plot(*_series(history, key), marker=".", label=f"agent {agent}, round {rnd}")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("step")
    ax.set_ylabel("silence rate")
    ax.set_title("Strategic silence per agent and round")
    if keys:
        ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def write_training_plots(history: History, out_dir: Path) -> list[Path]:
    """All four training plots into ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return [plot_reward_accuracy(history, out_dir / "reward_accuracy.png"),
            plot_tokens_budget(history, out_dir / "tokens_budget.png"),
            plot_lambda(history, out_dir / "lambda_tok.png"),
            plot_silence(history, out_dir / "silence.png")]
