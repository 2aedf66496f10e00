"""The metric vocabulary (docs/architecture.md) and parameter flattening.

Kept free of MLflow imports so evaluation, training and DVC code can validate names cheaply.
A metric name outside the vocabulary raises ``ValueError``: it is a programming error, and
failing loudly is the only way to stop dashboards, DVC metrics and Prefect artifacts from
drifting apart (``train/acc`` vs ``train/accuracy``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

METRIC_NAMES: frozenset[str] = frozenset({
    "train/reward", "train/accuracy", "train/tokens_total", "train/tokens_completion",
    "train/tokens_communicated", "train/turns", "train/repetition", "train/silence_rate",
    "train/lambda_tok", "train/budget",
    "gspo/clip_frac_low", "gspo/clip_frac_high", "gspo/ratio_mean", "gspo/approx_kl", "gspo/grad_norm",
    "perf/rollout_tokens_per_s", "perf/step_s",
})
"""Fixed metric names (docs/architecture.md); per-benchmark evaluation metrics match :data:`EVAL_METRIC_RE`."""

EXTRA_METRIC_NAMES: frozenset[str] = frozenset({
    "train/budget_tokens", "train/zero_adv_groups", "train/adv_groups", "gspo/loss", "gspo/kl_ref",
    "gspo/kl_base", "train/silence_prob", "train/calls_skipped", "train/cap_hit_rate", "train/episodes",
    "train/messages", "silence/informed", "silence/uninformed", "silence/decider",
    "perf/rss_rollout_gb", "perf/rss_update_gb", "perf/cuda_rollout_gb", "perf/cuda_update_gb",
    "gspo/zero_adv_groups_frac", "gspo/noop_step",
})
"""Diagnostics beyond the contract: the budget-measure token mean the dual controller sees, groups
whose advantages were zero, the loss itself, the KL of π_old from the base policy, the silence
token's mean first-token probability (the exploration rate), calls the protocol skipped, replies
that reached the length cap, silence of the agents that held / did not hold the private fact
on split-information items, silence of the decision agent (``mas.aggregation: decision_agent``),
and the peak memory of the rollout and of the updates
(``components.gspo.memory``), the share of advantage groups with zero spread and whether the step's
update was a no-op (:func:`components.gspo.trainer.noop_reason`: every group zero, every ratio
clipped or a zero gradient) (search metrics are checked in components/search)."""

EVAL_SUMMARY_NAMES: frozenset[str] = frozenset({
    "eval/accuracy", "eval/accuracy_micro", "eval/n", "eval/correct", "eval/benchmarks", "eval/tokens_total",
    "eval/tokens_total_mean", "eval/tokens_completion", "eval/tokens_communicated", "eval/tokens_per_correct",
    "eval/silence_rate", "eval/grading_errors",
})
"""One evaluated system over all benchmarks (``components.evaluation.metrics.summarise`` as ``eval/<key>``);
``eval/accuracy`` and ``eval/tokens_total`` are what the promotion gate compares."""

SILENCE_METRIC_RE = re.compile(r"^silence/agent\d+_round\d+$")
"""``silence/agent<a>_round<r>``: silence rate per agent and round (training plots)."""

EVAL_METRIC_SUFFIXES: tuple[str, ...] = ("accuracy", "tokens_total", "tokens_per_correct", "silence_rate")
EVAL_METRIC_RE = re.compile(r"^eval/(?P<bench>[a-z0-9][a-z0-9_.\-]*)/(?P<metric>"
                            + "|".join(EVAL_METRIC_SUFFIXES) + r")$")
"""``eval/<benchmark>/<metric>``; the benchmark is lower-case (``gsm8k``, ``math500``, ...)."""


def is_metric_name(name: str) -> bool:
    """True when ``name`` belongs to the vocabulary."""
    return (name in METRIC_NAMES or name in EXTRA_METRIC_NAMES or name in EVAL_SUMMARY_NAMES
            or EVAL_METRIC_RE.match(name) is not None
            or SILENCE_METRIC_RE.match(name) is not None)


def validate_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Check every name and value; return ``{name: float(value)}``.

    Raises ``ValueError`` listing all unknown names (with the allowed vocabulary) or the first
    non-numeric value. NaN/inf are allowed (MLflow stores them; a diverged run should show it).
    """
    unknown = sorted(k for k in metrics if not isinstance(k, str) or not is_metric_name(k))
    if unknown:
        raise ValueError(
            f"unknown metric name(s) {unknown}; allowed: {sorted(METRIC_NAMES)} and "
            f"eval/<benchmark>/{{{','.join(EVAL_METRIC_SUFFIXES)}}}")
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if hasattr(value, "item"):  # numpy / torch scalars
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"metric {key!r}: value {value!r} is not a number")
        out[key] = float(value)
    return out


def _leaf(value: Any) -> str:
    if value is None or isinstance(value, str | bool | int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return str(value)


def flatten_params(params: Mapping[str, Any] | Any, *, prefix: str = "", sep: str = ".",
                   max_value_len: int = 6000) -> dict[str, str]:
    """Flatten nested mappings into ``a.b.c -> str`` MLflow params.

    Accepts a mapping or a pydantic model (``model_dump(mode="json")`` is used, so the
    project ``Config`` can be passed as is). Lists stay one JSON-encoded param, since a
    benchmark list is one setting, not N. Values longer than ``max_value_len`` (MLflow's
    limit is 6000) are cut and end with ``...`` so a long list never fails a run.
    """
    if hasattr(params, "model_dump"):
        params = params.model_dump(mode="json")
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a mapping or a pydantic model, got {type(params).__name__}")
    out: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.update(flatten_params(value, prefix=name, sep=sep, max_value_len=max_value_len))
            continue
        text = _leaf(dict(value) if isinstance(value, Mapping) else value)
        if len(text) > max_value_len:
            text = text[: max_value_len - 3] + "..."
        out[name] = text
    return out
