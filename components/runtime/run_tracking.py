"""The training run's MLflow side: its run, the metric outbox, and the final model's registration.

Apart from :mod:`components.runtime.training_run` because importing it loads MLflow (through
:mod:`components.tracking`): a run without tracking (``--no-track``, ranks other than 0) never
imports this module.

Tracking never stops training: each step's checkpoint is written first, then its metrics are
queued for a background sender (:class:`components.tracking.outbox.MetricOutbox`) that retries
through an outage; metrics not yet acknowledged are stored in every checkpoint and re-sent on
resume. Only the end of training waits for the server (``tracking.outage_wait_s``) to log the model.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from components.config import Config
from components.data.prepare import manifest_sha256
from components.tracking import Tracker, TrackingError, git_commit
from components.tracking.outbox import MetricOutbox, Row, retry_until
from components.tracking.served import system_settings
from components.tracking.versions import REGISTERED_FILE, VersionRef, registration_of, write_registration


@contextlib.contextmanager
def tracking(cfg: Config, run_name: str, run_id: str | None, pending: list[Row]) -> Iterator[RunTracking]:
    """The run's MLflow run (``run_id`` when resuming) with an outbox holding what a crashed run had
    not sent. A resumed run whose MLflow run is not on this server (the URI moved, the run was
    deleted) goes on in a new run: the checkpoint holds the weights, the tracking server only a
    record of them."""
    with Tracker.from_config(cfg, run_name, {"stage": "train"}, run_id=run_id, new_run_if_missing=True) as tracker:
        outbox = MetricOutbox(tracker)
        try:
            outbox.restore(pending)
            if tracker.run_id != run_id:  # a new run (also one replacing a lost run)
                tracker.log_params(cfg.flat())
            yield RunTracking(tracker, outbox)
        finally:
            outbox.close()


@dataclass
class RunTracking:
    """The MLflow run of a training run and its outbox (metrics not yet acknowledged)."""

    tracker: Tracker
    outbox: MetricOutbox

    def registered_by_this_run(self, final: Path, cfg: Config) -> VersionRef | None:
        """The registry version this same MLflow run already made from ``final``, if it still exists
        (read it before ``final`` is rewritten)."""
        run_id = self.tracker.run_id
        try:
            recorded = json.loads((final / REGISTERED_FILE).read_text()).get("run_id")
        except (OSError, ValueError, AttributeError):
            return None
        if run_id is None or recorded != run_id:
            return None
        try:
            return registration_of(final, uri=cfg.tracking.uri)
        except Exception:  # noqa: BLE001 - registry unreachable: register as usual (its retries apply)
            return None


    def report_final(self, cfg: Config, out: Path, plots: list[Path], steps: int,
                     earlier: VersionRef | None) -> str | None:
        """Drain the outbox, log the plots and history, and register ``out/final`` (unless ``earlier``,
        the version this run registered before a retry); returns the model version."""
        final, tracker, outbox = out / "final", self.tracker, self.outbox
        deadline = time.monotonic() + cfg.tracking.outage_wait_s
        if not outbox.drain(cfg.tracking.outage_wait_s):
            raise TrackingError(
                f"training finished ({steps} steps; checkpoints and {final} are saved), but the tracking "
                f"server did not take the metrics of {len(outbox.pending())} step(s) within tracking.outage_wait_s="
                f"{cfg.tracking.outage_wait_s:g} s ({outbox.last_error}); once it is back, rerun with --resume to log "
                f"them and the model (nothing is retrained)")
        for path in plots:
            retry_until(lambda path=path: tracker.log_artifact(path, "plots"), deadline)
        retry_until(lambda: tracker.log_artifact(out / "history.json"), deadline)
        if not cfg.tracking.log_model:
            return None
        commit = git_commit()
        tags = {"config.sha256": cfg.hash(), "git.commit": commit or "unknown",
                "data.manifest_sha256": manifest_sha256(Path(cfg.data.out_dir)) or "missing",
                "config.profile": cfg.profile, "train.run_id": tracker.run_id, "train.steps": str(steps)}
        settings = system_settings(cfg, git_commit=commit)
        if earlier is not None:
            version = earlier.version
            print(f"{cfg.registry.model_name} version {earlier.version} was registered by this run already "
                  "(resumed at its last step): not registered again", file=sys.stderr)
        else:
            logged = retry_until(lambda: tracker.log_policy_model(final, registered_name=cfg.registry.model_name,
                                                                  tags=tags, settings=settings), deadline)
            version = str(getattr(logged, "version", logged))
        write_registration(final, VersionRef(cfg.registry.model_name, version), uri=cfg.tracking.uri,
                           run_id=tracker.run_id)
        print(f"registered {cfg.registry.model_name} version {version}", file=sys.stderr)
        return version
