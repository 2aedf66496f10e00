"""MLflow 3 run logging: a :class:`Tracker` context manager, provenance helpers, model logging.

Design choices:

* Runs are started with the fluent API (``mlflow.start_run``) so ``nested=True`` and plain
  ``mlflow.log_*`` calls inside the ``with`` block work, but every Tracker write goes through an
  explicit ``MlflowClient(uri)`` with the run id, so logging from Prefect worker threads (which
  do not see the fluent, thread-local active run) still lands in the right run.
* Every metric name is checked against :mod:`components.tracking.metric_names` before any
  network call: unknown names raise ``ValueError``.
* Transient HTTP failures are retried by MLflow's own session (urllib3 ``Retry``), configured
  through environment variables that MLflow reads on every request:
  ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` (MLflow default 7), ``MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR``
  (default 2, sleeps factor*2^n, capped at 120 s) and ``MLFLOW_HTTP_REQUEST_TIMEOUT`` (default
  120 s per request). With those defaults a dead server blocks a run for minutes, so
  :func:`configure_http_retries` sets bounded defaults (:data:`HTTP_RETRY_DEFAULTS`: 3 retries,
  backoff 1 s -> 1+2+4 s, 30 s timeout) unless the user already set the variables.
* Any backend failure becomes :class:`TrackingError` naming the URI and the operation; an
  ``http(s)://`` URI is probed at ``/health`` before the run starts so a wrong URI fails in
  seconds with a fix-it message instead of after the retry budget.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import mlflow
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException

from components.redact import redact
from components.tracking.backend import (
    BACKEND_ERRORS,
    HTTP_RETRY_DEFAULTS,
    check_reachable,
    configure_http_retries,
    git_commit,
    guarded,
)
from components.tracking.errors import ModelUriError, PromotionError, TrackingError
from components.tracking.lineage import log_lineage
from components.tracking.metric_names import (
    EVAL_METRIC_RE,
    METRIC_NAMES,
    flatten_params,
    is_metric_name,
    validate_metrics,
)
from components.tracking.policy_model import log_policy_model, resolve_model_uri

if TYPE_CHECKING:
    from components.config import Config

try:  # MLflow's own limits; the fallbacks are the values of MLflow 3.17.
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH, MAX_TAG_VAL_LENGTH
except ImportError:  # pragma: no cover
    MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH, MAX_TAG_VAL_LENGTH = 6000, 100, 8000

__all__ = [
    "EVAL_METRIC_RE", "HTTP_RETRY_DEFAULTS", "METRIC_NAMES", "ModelUriError", "PromotionError", "Tracker",
    "TrackingError", "check_reachable", "configure_http_retries", "flatten_params", "git_commit",
    "is_metric_name", "log_policy_model", "resolve_model_uri", "validate_metrics",
]
METRICS_PER_BATCH = 1000  # MLflow's MAX_METRICS_PER_BATCH
RESUMED_FROM_TAG = "agent_gspo.resumed_from_run"
"""tag of a run that continues a training whose earlier MLflow run this server does not have"""
T = TypeVar("T")


def _str_tags(tags: Mapping[str, Any] | None) -> dict[str, str]:
    return {str(k): redact(str(v))[:MAX_TAG_VAL_LENGTH] for k, v in (tags or {}).items()}


@contextlib.contextmanager
def _without_store_tracebacks() -> Iterator[None]:
    """Mute MLflow's database layer while a run ends: on a locked sqlite file it logs the whole
    SQLAlchemy traceback (~60 lines) before raising; the caller reports the failure in one line."""
    store_log = logging.getLogger("mlflow.store.db.utils")
    level = store_log.level
    store_log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        store_log.setLevel(level)


@dataclass(frozen=True)
class Resume:
    """A run a :class:`Tracker` continues (a resumed training job) instead of starting one."""

    run_id: str
    new_run_if_missing: bool = False
    """a run this server does not have (deleted, or logged to another server) starts a new run,
    tagged :data:`RESUMED_FROM_TAG`, with a warning; else that is a :class:`TrackingError`"""


class Tracker:
    """One MLflow run as a context manager.

    ``with Tracker("sqlite:///mlflow.db", "agent-gspo", "train", {"stage": "train"}) as t:``
    creates the experiment if needed, starts the run (``nested=True`` puts it under the active
    fluent run), and ends it FINISHED, or FAILED / KILLED when the block raises. The tracking
    URI is also set as MLflow's global URI (fluent calls inside the block use it).
    """

    def __init__(self, uri: str, experiment: str, run_name: str | None = None,
                 tags: Mapping[str, Any] | None = None, nested: bool = False, resume: Resume | None = None) -> None:
        run_id = resume.run_id if resume is not None else None
        new_run_if_missing = resume.new_run_if_missing if resume is not None else False
        self.uri = uri
        self.experiment = experiment
        self.run_name = run_name
        self.tags = _str_tags(tags)
        self.nested = nested
        self.client: MlflowClient | None = None
        self.run_id: str | None = run_id
        """given: continue that run (a resumed training job); else a new run is started"""
        self.new_run_if_missing = new_run_if_missing
        """a given ``run_id`` this server does not have (deleted, or logged to another server) starts a
        new run, tagged :data:`RESUMED_FROM_TAG`, with a warning; else that is a :class:`TrackingError`"""
        self.resumed_from: str | None = None
        """the run id that was asked for and replaced by a new run (see ``new_run_if_missing``)"""
        self.experiment_id: str | None = None

    @classmethod
    def from_config(cls, config: Config, run_name: str | None = None, tags: Mapping[str, Any] | None = None,
                    nested: bool = False, run_id: str | None = None, new_run_if_missing: bool = False) -> Tracker:
        """A Tracker at ``config.tracking.uri`` / ``config.tracking.experiment``, tagged with the
        config hash and profile (``config`` is :class:`components.config.Config`)."""
        base = {"config.sha256": config.hash(), "config.profile": config.profile}
        if sha := git_commit():
            base["git.commit"] = sha
        resume = Resume(run_id, new_run_if_missing) if run_id is not None else None
        return cls(config.tracking.uri, config.tracking.experiment, run_name, {**base, **(tags or {})}, nested,
                   resume)

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> Tracker:
        configure_http_retries()
        if redact(self.uri) != self.uri:  # MLflow prints "View run ... at <uri>/#/..." with the password
            os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        check_reachable(self.uri)
        mlflow.set_tracking_uri(self.uri)
        self.client = self._guard("open the tracking store", lambda: MlflowClient(tracking_uri=self.uri))
        self.experiment_id = self._guard("get or create experiment", self._experiment_id)
        resume = self.run_id
        if resume is not None and self.new_run_if_missing and self._run_missing(resume):
            self.resumed_from, resume = resume, None
            self.tags[RESUMED_FROM_TAG] = self.resumed_from
        run = self._guard("start run", lambda: mlflow.start_run(
            run_id=resume, experiment_id=None if resume else self.experiment_id,
            run_name=None if resume else self.run_name, tags=self.tags or None, nested=self.nested))
        self.run_id = run.info.run_id
        if self.resumed_from is not None:
            print(f"warning: MLflow run {self.resumed_from} is not on {redact(self.uri)} (the tracking URI moved, "
                  f"or the run was deleted): the resumed training logs to a new run {self.run_id} (tagged "
                  f"{RESUMED_FROM_TAG}); the metrics of the earlier steps stay with run {self.resumed_from} on "
                  "the server that had it", file=sys.stderr)
        return self

    def _run_missing(self, run_id: str) -> bool:
        """Does this server lack ``run_id`` (never logged here, or deleted)? Any other failure to look
        it up is left to ``start_run``, which reports it as before."""
        assert self.client is not None
        try:
            run = self.client.get_run(run_id)
        except MlflowException as exc:
            return exc.error_code == "RESOURCE_DOES_NOT_EXIST"
        except BACKEND_ERRORS:
            return False
        return run.info.lifecycle_stage == "deleted"

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            status = "FINISHED"
        elif issubclass(exc_type, KeyboardInterrupt):
            status = "KILLED"
        else:
            status = "FAILED"
        active = mlflow.active_run()
        try:
            with _without_store_tracebacks():
                if active is not None and active.info.run_id == self.run_id:
                    mlflow.end_run(status=status)  # pops the run first: MLflow's exit hook won't retry it
                elif self.client is not None and self.run_id is not None:  # left in another thread
                    self.client.set_terminated(self.run_id, status=status)
        except BACKEND_ERRORS as err:
            # the run's work is done (and an exception of the block, if any, is on its way): one line,
            # not MLflow's traceback, and no masking of that exception
            first = redact(str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__)
            print(f"warning: MLflow run {self.run_id} could not be marked {status} on {redact(self.uri)} "
                  f"({first[:200]}); it shows RUNNING there until someone ends it "
                  f"(MlflowClient().set_terminated(run_id, {status!r}))", file=sys.stderr)

    def _experiment_id(self) -> str:
        assert self.client is not None
        found = self.client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(self.experiment)
        except MlflowException:  # another process created it between the two calls
            found = self.client.get_experiment_by_name(self.experiment)
            if found is None:
                raise
            return found.experiment_id

    def _guard(self, operation: str, fn: Callable[[], T]) -> T:
        return guarded(self.uri, operation, fn)

    def _require(self) -> tuple[MlflowClient, str]:
        if self.client is None or self.run_id is None:
            raise RuntimeError("Tracker used outside its `with` block")
        return self.client, self.run_id

    # -- logging -----------------------------------------------------------------------------
    def log_params(self, params: Mapping[str, Any] | Any) -> dict[str, str]:
        """Flatten (``a.b``), stringify, redact URI passwords, truncate to MLflow's 6000 chars; log in
        chunks of 100."""
        client, run_id = self._require()
        flat = {k: redact(v) for k, v in flatten_params(params, max_value_len=MAX_PARAM_VAL_LENGTH).items()}
        items = [Param(k, v) for k, v in flat.items()]
        for i in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
            chunk = items[i:i + MAX_PARAMS_TAGS_PER_BATCH]
            self._guard("log params", lambda chunk=chunk: client.log_batch(run_id, params=chunk))
        return flat

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None, model_id: str | None = None) -> None:
        """Validate names (``ValueError`` on unknown ones) and log all values at ``step``.

        ``model_id`` (a registered version's ``model_id``) also links the values to that model, so
        the MLflow UI shows them on the model's page."""
        self.log_metric_rows([(step or 0, int(time.time() * 1000), validate_metrics(metrics))], model_id=model_id)

    def log_metric_rows(self, rows: Sequence[tuple[int, int, Mapping[str, float]]],
                        model_id: str | None = None) -> None:
        """Log ``(step, unix time in ms, validated metrics)`` rows, 1000 values per request."""
        client, run_id = self._require()
        items = [Metric(k, float(v), ts, step, model_id=model_id)
                 for step, ts, values in rows for k, v in values.items()]
        for i in range(0, len(items), METRICS_PER_BATCH):
            chunk = items[i:i + METRICS_PER_BATCH]
            self._guard("log metrics", lambda chunk=chunk: client.log_batch(run_id, metrics=chunk))

    def log_inputs(self, *, datasets: Sequence[Any] = (), context: str = "", model_ids: Sequence[str] = ()) -> None:
        """Record MLflow ``Dataset`` entities (used as ``context``: training, evaluation) and logged
        models as inputs of the run (:mod:`components.tracking.lineage`)."""
        client, run_id = self._require()
        log_lineage(client, self.uri, run_id, datasets=datasets, context=context, model_ids=model_ids)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Set run tags (values stringified, truncated to MLflow's limit)."""
        client, run_id = self._require()
        items = [RunTag(k, v) for k, v in _str_tags(tags).items()]
        for i in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
            chunk = items[i:i + MAX_PARAMS_TAGS_PER_BATCH]
            self._guard("set tags", lambda chunk=chunk: client.log_batch(run_id, tags=chunk))

    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        """Upload a file, or a folder's contents, under ``artifact_path`` of the run."""
        client, run_id = self._require()
        local = Path(path)
        if not local.exists():
            raise TrackingError(f"log_artifact: {local} does not exist")
        if local.is_dir():
            self._guard(f"log artifacts {local}",
                        lambda: client.log_artifacts(run_id, str(local), artifact_path))
        else:
            self._guard(f"log artifact {local}",
                        lambda: client.log_artifact(run_id, str(local), artifact_path))

    def log_figure(self, figure: Any, artifact_file: str) -> None:
        """Save a matplotlib / plotly figure as ``artifact_file`` (e.g. ``plots/tokens.png``)."""
        client, run_id = self._require()
        self._guard(f"log figure {artifact_file}", lambda: client.log_figure(run_id, figure, artifact_file))

    def log_policy_model(self, model_dir: str | os.PathLike[str], *, registered_name: str,
                         tags: Mapping[str, Any], settings: Mapping[str, Any]) -> Any:
        """:func:`log_policy_model` into this run."""
        self._require()
        return log_policy_model(Path(model_dir), registered_name=registered_name, tags=tags, settings=settings,
                                tracking_uri=self.uri)

    @contextlib.contextmanager
    def child(self, run_name: str, tags: Mapping[str, Any] | None = None) -> Iterator[Tracker]:
        """A nested run under this one (same URI and experiment)."""
        with Tracker(self.uri, self.experiment, run_name, tags, nested=True) as sub:
            yield sub

