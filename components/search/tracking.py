"""Optional MLflow logging of a search: one parent run per worker, one nested run per trial.

``run_search`` only needs duck-typed objects (:class:`ParentRun` / :class:`TrialRun`), so tests
and users without a tracking server pass ``tracker_factory=None``; :func:`mlflow_tracker_factory`
builds the real one from :class:`components.tracking.Tracker`.

Search metrics (``search/...``) are not part of the fixed metric vocabulary (docs/architecture.md) that
``Tracker.log_metrics`` enforces, so :func:`log_search_metrics` writes them through the run's
public ``client``/``run_id`` (a :class:`Tracker` exposes both); names that are in the
vocabulary still go through ``log_metrics`` and its checks.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from components.config import Config
from components.tracking.metric_names import is_metric_name

SEARCH_METRICS: frozenset[str] = frozenset({
    "search/dev_accuracy", "search/mean_tokens_per_episode", "search/constraint", "search/tokens_spent",
    "search/seconds", "search/best_dev_accuracy", "search/best_mean_tokens_per_episode",
    "search/best_constraint", "search/tokens_spent_total", "search/trials_complete",
})
"""Metric names a search logs (per trial run, and ``best_*``/totals on the parent run)."""


class TrialRun(Protocol):
    """What a nested per-trial run must offer (satisfied by ``components.tracking.Tracker``)."""

    def log_params(self, params: Mapping[str, Any]) -> Any: ...

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None: ...

    def set_tags(self, tags: Mapping[str, Any]) -> None: ...


class ParentRun(TrialRun, Protocol):
    """The per-worker parent run: opens nested trial runs and takes the params file artifact."""

    def child(self, run_name: str, tags: Mapping[str, Any] | None = None
              ) -> contextlib.AbstractContextManager[TrialRun]: ...

    def log_artifact(self, path: Any, artifact_path: str | None = None) -> None: ...


TrackerFactory = Callable[[], contextlib.AbstractContextManager[ParentRun]]
"""Zero-argument callable returning the parent run's context manager."""


def log_search_metrics(run: TrialRun, metrics: Mapping[str, float], step: int | None = None) -> None:
    """Log ``metrics`` on ``run``: vocabulary names via ``log_metrics``, ``search/*`` via the client."""
    unknown = sorted(k for k in metrics if not is_metric_name(k) and k not in SEARCH_METRICS)
    if unknown:
        raise ValueError(f"unknown search metric name(s) {unknown}; allowed: {sorted(SEARCH_METRICS)}")
    known = {k: v for k, v in metrics.items() if is_metric_name(k)}
    extra = {k: float(v) for k, v in metrics.items() if k not in known}
    if known:
        run.log_metrics(known, step=step)
    if not extra:
        return
    client, run_id = getattr(run, "client", None), getattr(run, "run_id", None)
    if client is None or run_id is None:  # duck-typed test runs
        run.log_metrics(extra, step=step)
        return
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    batch = [Metric(k, v, now, step or 0) for k, v in extra.items()]
    from components.tracking.backend import guarded  # backend failures -> TrackingError naming the URI

    guarded(str(getattr(run, "uri", "<unknown>")), "log search metrics",
            lambda: client.log_batch(run_id, metrics=batch))


def mlflow_tracker_factory(cfg: Config, run_name: str = "search",
                           tags: Mapping[str, Any] | None = None) -> TrackerFactory:
    """Parent-run factory on ``cfg.tracking.uri`` / ``cfg.tracking.experiment``."""
    from components.tracking import Tracker

    base_tags = {"stage": "search", "study": cfg.search.study_name, "config_hash": cfg.hash()}
    base_tags.update(tags or {})

    @contextlib.contextmanager
    def factory() -> Iterator[ParentRun]:
        with Tracker(cfg.tracking.uri, cfg.tracking.experiment, run_name, base_tags) as parent:
            yield parent

    return factory
