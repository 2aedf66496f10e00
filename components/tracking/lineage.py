"""Lineage in MLflow's own fields: the prepared data a run read, and the model an evaluation measured.

* **Datasets** (run inputs, the run page's "Datasets used"): each prepared split a run read, one
  dataset named ``<benchmark>/<split>`` with source = the parquet file's path and digest = its
  content hash from ``manifest.json`` (``output_sha256``). MLflow caps a digest at 36 characters
  (``MAX_DATASET_DIGEST_SIZE``), so the digest is the hash's first 36 hex digits; the whole hash
  and the row count are the dataset's profile. The input's ``mlflow.data.context`` tag says how it
  was used: ``training`` or ``evaluation``. A split the manifest does not list (data prepared
  by an older version) is hashed from the file itself.
* **Evaluated model** (run inputs, "Logged models"): the registered version's logged model, as a
  ``LoggedModelInput``; the summary metrics are also logged with its ``model_id``
  (:meth:`components.tracking.mlflow_logging.Tracker.log_metrics`).

Both are written with one explicit client call on the run (``MlflowClient.log_inputs``), like
every other Tracker write, so they land in the right run from any thread.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from mlflow import MlflowClient
from mlflow.entities import Dataset, DatasetInput, InputTag, LoggedModelInput
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

from components.io import file_sha256

if TYPE_CHECKING:
    from components.config import Config
from components.tracking.backend import guarded
from components.tracking.errors import TrackingError

try:  # MLflow's limit; the fallback is the value of MLflow 3.17
    from mlflow.utils.validation import MAX_DATASET_DIGEST_SIZE
except ImportError:  # pragma: no cover
    MAX_DATASET_DIGEST_SIZE = 36

TRAINING, EVALUATION = "training", "evaluation"
log = logging.getLogger(__name__)
MANIFEST = "manifest.json"
SOURCE_TYPE = "local"
"""MLflow's source type of a local file (its ``LocalArtifactDatasetSource``: JSON ``{"uri": path}``)"""


def _manifest(data_dir: Path) -> Mapping[str, Any]:
    try:
        return json.loads((data_dir / MANIFEST).read_text()).get("benchmarks", {})
    except (OSError, ValueError, AttributeError):
        return {}


def prepared_datasets(data_dir: str | os.PathLike[str], splits: Iterable[tuple[str, str]]) -> list[Dataset]:
    """One MLflow dataset per ``(benchmark, split)`` prepared under ``data_dir`` (module docstring)."""
    root = Path(data_dir)
    manifest = _manifest(root)
    out: list[Dataset] = []
    for bench, split in dict.fromkeys(splits):  # each once, in order
        path = (root / bench / f"{split}.parquet").resolve()
        entry = manifest.get(bench, {})
        sha = entry.get("output_sha256", {}).get(f"{bench}/{split}.parquet")
        if sha is None and path.is_file():
            sha = file_sha256(path)
        if sha is None:
            continue  # never read: nothing to record
        profile = {"sha256": sha, "num_rows": entry.get("rows", {}).get(split)}
        out.append(Dataset(name=f"{bench}/{split}", digest=sha[:MAX_DATASET_DIGEST_SIZE], source_type=SOURCE_TYPE,
                           source=json.dumps({"uri": str(path)}), profile=json.dumps(profile)))
    return out


def log_lineage(client: MlflowClient, uri: str, run_id: str, *, datasets: Sequence[Dataset] = (), context: str = "",
                model_ids: Sequence[str] = ()) -> None:
    """Record ``datasets`` (used as ``context``) and ``model_ids`` as inputs of run ``run_id``."""
    inputs = [DatasetInput(d, [InputTag(MLFLOW_DATASET_CONTEXT, context)] if context else []) for d in datasets]
    models = [LoggedModelInput(m) for m in model_ids]
    if inputs or models:
        guarded(uri, f"log the inputs of run {run_id}",
                lambda: client.log_inputs(run_id, datasets=inputs or None, models=models or None))


def log_training_inputs(cfg: Config, run_id: str | None) -> bool:
    """The training splits (``data.train_sources`` under ``data.out_dir``) as inputs of ``run_id``.

    Called once training is over (its run ended, its model registered), from the process that
    launched it: a failure is one warning line, not a failed training; False then."""
    if run_id is None:
        return False
    splits = [tuple(source.split("/", 1)) for source in cfg.data.train_sources]
    datasets = prepared_datasets(cfg.data.out_dir, splits)  # type: ignore[arg-type]
    uri = cfg.tracking.uri
    try:
        client = guarded(uri, "open the tracking store", lambda: MlflowClient(tracking_uri=uri))
        log_lineage(client, uri, run_id, datasets=datasets, context=TRAINING)
    except TrackingError as exc:
        log.warning("warning: the training data was not recorded as inputs of MLflow run %s (%s)", run_id, exc)
        return False
    return True


class InputsLogger(Protocol):
    """What :func:`log_evaluation_inputs` needs of a run: ``Tracker.log_inputs`` (a protocol, not the
    class: the tracker imports this module)."""

    def log_inputs(self, *, datasets: Sequence[Any] = (), context: str = "", model_ids: Sequence[str] = ()) -> None: ...


def log_evaluation_inputs(tracker: InputsLogger, meta: Mapping[str, Any], model_id: str | None) -> None:
    """The evaluated splits (``meta``: an evaluation report's ``data_dir``, ``item_ids`` per benchmark
    and ``split``) and the evaluated version's logged model as inputs of the tracker's run."""
    benches = list(meta.get("item_ids", {}))
    dev = (meta.get("devset") or {}).get("benchmarks", {})  # the dev set: each benchmark's own source split
    datasets = prepared_datasets(meta["data_dir"], [(b, str(dev[b]["split"] if b in dev else meta["split"]))
                                                    for b in benches])
    tracker.log_inputs(datasets=datasets, context=EVALUATION, model_ids=[model_id] if model_id else [])
