"""The training job: in this process, or as a subprocess / distributed launch of the same config.

``deepspeed.launcher=none`` trains in the caller's process unless ``isolate`` asks for a
subprocess (the Prefect task does, so a crash or SIGKILL of training never takes the flow down,
and its retry resumes from the last checkpoint); ``torchrun`` / ``deepspeed`` always launch
``components.runtime.train_main`` on every rank. A subprocess loads the config from the job's
:class:`ConfigSource` (same file, profile and overrides), and its final JSON line comes back
as the :class:`components.runtime.training_run.TrainResult` (:func:`components.runtime.launch.launch_training`
builds the command and, for multi-node DeepSpeed, the environment file).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field

from components.errors import ProcessFailed, UserError
from components.io import check_not_pipeline_input, check_output_file
from components.jobs.base import ConfigSource, Job
from components.jobs.metrics import SERIES_FILE, train_metrics, write_metrics, write_series
from components.runtime.launch import hosts_rank_zero, launch_training
from components.runtime.training_dtype import check_training_dtype_setting

if TYPE_CHECKING:
    from components.runtime.training_run import TrainResult


class TrainingFailed(ProcessFailed, RuntimeError):
    """A training process died (signal, crash): worth a retry with ``resume``."""


class TrainJob(Job):
    """``agent-gspo train``; see the module docstring."""

    KIND = "train"
    source: ConfigSource = Field(default_factory=ConfigSource, description="how ``cfg`` was loaded")
    resume: bool = Field(False, description="continue from the newest checkpoint in the run folder")
    overwrite: bool = Field(False, description="delete the run folder's checkpoints and start over")
    max_steps: int | None = Field(None, ge=1, description="stop after N steps (default gspo.steps)")
    out_dir: str | None = Field(None, description="run folder (default gspo.out_dir)")
    track: bool = Field(True, description="log an MLflow run and register the final policy")
    isolate: bool = Field(False, description="train in a subprocess even with deepspeed.launcher=none")
    metrics_file: str | None = Field(None, description="write the last step's numbers here (DVC metrics); the "
                                     "per-step series is always written to history.csv in the run folder")
    on_line: Callable[[str], bool | None] | None = Field(
        None, exclude=True, description="gets each subprocess line; returns True when it showed the line itself")

    def args(self) -> list[str]:
        """Flags of ``python -m components.runtime.train_main`` for this job."""
        out = self.source.args()
        if self.resume:
            out.append("--resume")
        if self.overwrite:
            out.append("--overwrite")
        if self.max_steps is not None:
            out += ["--max-steps", str(self.max_steps)]
        if self.out_dir:
            out += ["--out", str(self.out_dir)]
        if not self.track:
            out.append("--no-track")
        return out

    def run(self) -> TrainResult:
        # refused before training, not after it: an output that is a pipeline input (params.yaml, a manifest)
        check_not_pipeline_input(self.out_dir or self.cfg.gspo.out_dir, "run folder (--out / gspo.out_dir)")
        if self.metrics_file:
            check_output_file(self.metrics_file, "metrics file (--metrics)")
        result = self._train()
        if result.history:  # the per-step series, a DVC plot (x = step); none on a multi-node worker
            write_series(Path(result.out_dir) / SERIES_FILE, result.history)
        if self.track and result.run_id is not None:  # the prepared splits it read, as the run's inputs
            from components.tracking.lineage import log_training_inputs

            log_training_inputs(self.cfg, result.run_id)  # a warning, not a failure: the model is registered
        if self.metrics_file:
            write_metrics(self.metrics_file, train_metrics(result.history))
        return result

    def _train(self) -> TrainResult:
        cfg = self.cfg
        if cfg.deepspeed.launcher == "none" and not self.isolate:
            from components.runtime.training_run import train

            check_training_dtype_setting(cfg.model.dtype)
            return train(cfg, resume=self.resume, overwrite=self.overwrite, max_steps=self.max_steps,
                         out_dir=self.out_dir, track=self.track)
        final: dict = {}

        def on_line(line: str) -> bool | None:
            if line.startswith("{") and '"final_model"' in line:
                final.update(json.loads(line))
            return self.on_line(line) if self.on_line is not None else None

        rc = launch_training(cfg, self.args(), on_line=on_line)
        out = Path(self.out_dir or cfg.gspo.out_dir)
        if rc == UserError.exit_code:
            raise UserError(f"training refused its input (exit {rc}); the message is in the output above")
        from components.runtime.training_run import TrainResult

        if rc == 0 and not final and not hosts_rank_zero(cfg):
            # a worker node of a multi-node run: rank 0 on node 0 writes the final model and reports it
            return TrainResult(out, None, cfg.gspo.steps, [], None, None)
        if rc != 0 or not final:
            from components.runtime.checkpoint import list_checkpoints

            hint = (f"`--resume` continues from the last checkpoint in {out}" if list_checkpoints(out)
                    else "no checkpoint was written: the launcher's or the first rank's output above says why")
            raise TrainingFailed(f"training exited with code {rc}{'' if rc else ' without a final model'}; {hint}")

        history = json.loads((out / "history.json").read_text()) if (out / "history.json").is_file() else []
        return TrainResult(out, Path(final["final_model"]), int(final["steps"]), history, final.get("run_id"),
                           final.get("model_version"))
