"""Where a scheduled (deployed) flow run writes: its own dated folder, never DVC's outputs.

``dvc.yaml``'s stages own ``data/``, ``reports/validation.md``, ``runs/smoke/final``, ``eval/`` and
``metrics/``. A nightly run that trained into ``runs/smoke`` with ``--overwrite`` and evaluated into
``eval/`` made ``dvc status`` report those stages changed after every night, and a later ``dvc repro``
would have thrown the night's model away. A flow run started by a deployment (or given ``run_root``)
therefore writes under::

    runs/scheduled/<flow name>/<UTC yyyymmddTHHMMSSZ>-<flow run id>/
        data/  reports/  train/  eval/  <flow>.json

by overrides placed *under* the caller's own (an explicit ``--set gspo.out_dir=...`` still wins).
A flow that only reads the prepared data (search, evaluate) keeps ``data.out_dir``: reading DVC's
``data/`` changes nothing. A run started by hand (``agent-gspo run``, a test calling the flow) has no
deployment and keeps the profile's folders unless it passes ``run_root``.

Such a run also searches in an Optuna study of its own, ``<search.study_name>-<folder name>``
(:func:`study_override`), in the configured ``search.storage``. Optuna opens a study by name with
``load_if_exists``, so every weekly search used to open the first week's study: recorded under another
config (this folder's output paths are part of it), week 2 exited 2 (:mod:`components.search.study_config`);
under the same config it would have found the study finished and run no trial.
``agent-gspo search`` by hand keeps the plain name, and so stays resumable by it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from components.dvc_outputs import tracked_outputs
from components.errors import UserError
from components.io import write_text_atomic

SCHEDULED_ROOT = "runs/scheduled"
"""default root of dated run folders (``/runs/`` is git-ignored and no DVC stage declares it)"""


def dated_folder(root: str | Path, flow_name: str, flow_run_id: str, now: datetime | None = None) -> Path:
    """``<root>/<flow_name>/<UTC date-time>-<flow run id>``: sortable by time, unique per flow run.

    The whole id: Prefect's server makes flow run ids UUIDv7, whose leading hex digits are a
    millisecond timestamp, the same for runs created within a minute of each other (a prefix of
    the id named one folder for two runs that started in the same second)."""
    stamp = (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    return Path(root) / flow_name / f"{stamp}-{flow_run_id}"


def folder_overrides(folder: Path, *, prepares_data: bool) -> list[str]:
    """Overrides that send every output of a flow run into ``folder`` (``data.out_dir`` only when the
    flow prepares data; otherwise it reads the prepared data where the profile says)."""
    out = [f"gspo.out_dir={folder / 'train'}", f"eval.out_dir={folder / 'eval'}",
           f"data.report_dir={folder / 'reports'}"]
    return [f"data.out_dir={folder / 'data'}", *out] if prepares_data else out


def study_override(study_name: str, folder: Path) -> str:
    """``search.study_name=<study_name>-<folder name>``: a fresh study for the flow run that writes into
    ``folder`` (its name holds the UTC date-time and the flow run id, so the studies of scheduled runs
    sort by time in the storage and each names its run folder). Goes under the caller's overrides like
    :func:`folder_overrides`: an explicit ``search.study_name`` still wins (to join a named study)."""
    return f"search.study_name={study_name}-{folder.name}"


def run_folder(run_root: str | None) -> Path | None:
    """This flow run's dated folder: under ``run_root`` when given, under :data:`SCHEDULED_ROOT` when the
    run was started by a deployment, else None (a run by hand keeps the profile's folders)."""
    from prefect.context import get_run_context

    ctx = get_run_context()
    flow_run = ctx.flow_run  # type: ignore[union-attr]
    if run_root is None and getattr(flow_run, "deployment_id", None) is None:
        return None
    check_run_root(run_root or SCHEDULED_ROOT)
    return dated_folder(run_root or SCHEDULED_ROOT, ctx.flow.name, str(flow_run.id))  # type: ignore[union-attr]


def check_run_root(run_root: str | Path, checkout: str | Path = ".") -> None:
    """:class:`UserError` (before anything is written) for a ``run_root`` inside an output of
    ``checkout/dvc.yaml``: ``run_root=eval`` put the dated folder into ``eval/``, the ``evaluate``
    stage's output, so ``dvc status`` called it changed and the next ``dvc repro`` deleted the run."""
    root = (Path(checkout) / run_root).resolve()
    for out in sorted(tracked_outputs(checkout)):
        if root == out or out in root.parents:
            raise UserError(f"run_root {run_root}: inside {out.relative_to(Path(checkout).resolve())}, an output "
                            f"of dvc.yaml; give a folder outside them (default {SCHEDULED_ROOT})")


def write_summary(folder: Path | None, name: str, summary: Any) -> None:
    """The run's result as ``<folder>/<name>.json`` (nothing without a dated folder)."""
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / f"{name}.json", json.dumps(summary, indent=2, default=str) + "\n")
