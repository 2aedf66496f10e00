"""Evaluation: seven benchmarks x {trained MAS, baselines}, accuracy and token cost, report and plots.

Entry point :func:`evaluate` (runner.py); pure helpers in sampling.py (seeded item sample),
metrics.py (EvalRow, standard error, Pareto front), report.py (JSON / markdown), plots.py (PNG).
"""

import importlib

from components.data.sampling import SamplingError, derived_seed, sample_items
from components.evaluation.metrics import (
    EvalRow,
    SilenceGrid,
    aggregate,
    silence_grid,
    standard_error,
    summarise,
)
from components.evaluation.report import benchmark_metrics, fmt_tokens, render_markdown, write_reports

__all__ = ["MAIN_SYSTEM", "EvalInputError", "EvalReport", "EvalRequest", "EvalRow", "SamplingError", "SilenceGrid",
           "System", "aggregate", "benchmark_metrics", "build_systems", "derived_seed", "eval_metrics", "evaluate",
           "fmt_tokens", "render_markdown", "run_system", "sample_items", "silence_grid",
           "standard_error", "summarise", "write_reports"]

_RUNNER = {"MAIN_SYSTEM", "EvalInputError", "EvalReport", "EvalRequest", "System", "build_systems", "eval_metrics",
           "evaluate", "run_system"}


def __getattr__(name: str) -> object:
    """The runner's names load on first use: it imports torch and the rollout engine, which the
    numbers alone (``EvalRow``, used by experiment results and reports) do not need."""
    if name in _RUNNER:
        return getattr(importlib.import_module("components.evaluation.runner"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
