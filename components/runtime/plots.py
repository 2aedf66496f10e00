"""Training plots (PNG): reward/accuracy, tokens vs budget, λ_tok, silence per agent and round.

Each function takes the trainer's per-step history (a list of metric dicts with ``step``) and
writes one PNG atomically. Matplotlib's Agg backend: no display, no network.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from components.plotting import History, draw_silence, save_png, step_axis
from components.plotting import series as _series


def plot_reward_accuracy(history: History, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for key, label in (("train/reward", "reward"), ("train/accuracy", "accuracy")):
        ax.plot(*_series(history, key), marker=".", label=label)
    ax.set_title("Reward and team accuracy")
    step_axis(ax, "reward / accuracy")
    return save_png(fig, path)


def plot_tokens_budget(history: History, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(*_series(history, "train/budget_tokens"), marker=".", label="mean tokens / episode (budget measure)")
    ax.plot(*_series(history, "train/budget"), linestyle="--", color="k", label="budget B")
    ax.plot(*_series(history, "train/tokens_communicated"), marker=".", alpha=0.6, label="communicated tokens")
    ax.set_title("Token use against the budget")
    step_axis(ax, "tokens")
    return save_png(fig, path)


def plot_lambda(history: History, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 3.0))
    ax.plot(*_series(history, "train/lambda_tok"), marker=".", color="tab:red")
    ax.axhline(0.0, color="k", linewidth=0.6)  # budget mode target: λ < 0 pays per token
    ax.set_title("Dual variable λ_tok")
    step_axis(ax, "λ_tok", legend=False)
    return save_png(fig, path)


def plot_silence(history: History, path: Path) -> Path:
    """One line per (agent, round): silence rate over training."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    draw_silence(ax, history, "Strategic silence per agent and round")
    return save_png(fig, path)


def write_training_plots(history: History, out_dir: Path) -> list[Path]:
    """All four training plots into ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return [plot_reward_accuracy(history, out_dir / "reward_accuracy.png"),
            plot_tokens_budget(history, out_dir / "tokens_budget.png"),
            plot_lambda(history, out_dir / "lambda_tok.png"),
            plot_silence(history, out_dir / "silence.png")]
