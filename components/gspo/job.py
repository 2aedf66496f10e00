"""The training job: config in, checkpoints + final policy + metrics + MLflow run out.

Runs identically as one CPU process, under ``torchrun`` / the ``deepspeed`` launcher on CPU
(gloo) or on GPU nodes: every rank calls :func:`train`; rank 0 alone writes the final model,
metrics, plots and talks to MLflow. With ``resume=True`` the newest complete checkpoint under
``out_dir`` is restored (weights, optimizer, scheduler, RNG, dual state, data cursor, history)
and, because rollouts are seeded per step, the run continues exactly as if never interrupted.
A fresh run refuses a folder that holds checkpoints or an earlier run's outputs (``final/``,
``metrics.json``, ...) unless ``overwrite=True`` (``--overwrite``), which deletes them all first.

Tracking never stops training: each step's checkpoint is written first, then its metrics are
queued for a background sender (:class:`components.tracking.outbox.MetricOutbox`) that retries
through an outage; metrics not yet acknowledged are stored in every checkpoint and re-sent on
resume. Only the end of training waits for the server (``tracking.outage_wait_s``) to log the model.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.config import Config
from components.data.item import Item
from components.data.train_items import load_train_items
from components.errors import UserError, run_command
from components.gspo.run_folder import check_fresh_start, check_resumable, delete_earlier_run, exclusive
from components.progress import leaf, log_to_stderr

StepCallback = Callable[[int, dict[str, float]], None]


@dataclass
class TrainResult:
    out_dir: Path
    final_model: Path | None
    steps: int
    history: list[dict[str, float]] = field(default_factory=list)
    run_id: str | None = None
    model_version: str | None = None
    plots: list[Path] = field(default_factory=list)


@contextlib.contextmanager
def _maybe_tracker(cfg: Config, enabled: bool, run_name: str, run_id: str | None) -> Iterator[Any]:
    if not enabled:
        yield None
        return
    from components.tracking import Tracker

    # a resumed run whose MLflow run is not on this server (the URI moved, the run was deleted) goes on
    # in a new run: the checkpoint holds the weights, the tracking server only a record of them
    with Tracker.from_config(cfg, run_name, {"stage": "train"}, run_id=run_id, new_run_if_missing=True) as tracker:
        yield tracker


def _progress_line(step: int, total: int, m: dict[str, float]) -> str:
    return (f"step {step}/{total}  reward {m.get('train/reward', 0):+.3f}  acc {m.get('train/accuracy', 0):.2f}  "
            f"tokens {m.get('train/budget_tokens', 0):.0f}/{m.get('train/budget', 0):.0f}  "
            f"λ {m.get('train/lambda_tok', 0):.3f}  silence {m.get('train/silence_rate', 0):.2f}  "
            f"clip {m.get('gspo/clip_frac_low', 0) + m.get('gspo/clip_frac_high', 0):.3f}  "
            f"{m.get('perf/rollout_tokens_per_s', 0):.0f} tok/s  {m.get('perf/step_s', 0):.1f} s/step"
            + _memory_part(m) + _noop_part(m))


def _noop_part(m: dict[str, float]) -> str:
    """``  no-op: all 4 advantage groups zero`` when the update could not move the policy."""
    from components.gspo.trainer import noop_reason

    reason = noop_reason(m)
    return f"  no-op: {reason}" if reason else ""


def _memory_part(m: dict[str, float]) -> str:
    """``  rss 1.2/3.4 GB`` (peak of the rollout / of the updates), plus the CUDA peaks when measured."""
    out = ""
    for kind, label in (("rss", "rss"), ("cuda", "cuda")):
        roll, upd = m.get(f"perf/{kind}_rollout_gb"), m.get(f"perf/{kind}_update_gb")
        if roll is not None and upd is not None:
            out += f"  {label} {roll:.1f}/{upd:.1f} GB"
    return out


def train(cfg: Config, *, resume: bool = False, overwrite: bool = False, max_steps: int | None = None,
          out_dir: str | Path | None = None,
          data_dir: Path | None = None, track: bool = True, on_step: StepCallback | None = None,
          items: list[Item] | None = None) -> TrainResult:
    """Run (or resume) GSPO training as configured; see the module docstring."""
    from components.io import check_writable_dir

    out = Path(out_dir or cfg.gspo.out_dir)
    total = max_steps if max_steps is not None else cfg.gspo.steps
    if total < 1:
        raise UserError(f"--max-steps must be >= 1, got {total}")

    check_writable_dir(out, "training output folder (--out / gspo.out_dir)")
    with exclusive(out):
        check_fresh_start(out, resume, overwrite)
        if resume:
            check_resumable(out, cfg)
        return _train(cfg, out, total, resume=resume, overwrite=overwrite, data_dir=data_dir, track=track,
                      on_step=on_step, items=items)


def _train(cfg: Config, out: Path, total: int, *, resume: bool, overwrite: bool, data_dir: Path | None,
           track: bool, on_step: StepCallback | None, items: list[Item] | None) -> TrainResult:
    """:func:`train` once the folder is checked and held."""
    from components.gspo.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
    from components.gspo.distributed import init_distributed, shutdown_distributed
    from components.gspo.engines import build_engine, planned_updates
    from components.gspo.resume import load_train_state
    from components.gspo.trainer import GSPOTrainer, seed_everything
    from components.mas.engine import RolloutEngine
    from components.mas.environment import Environment
    from components.models import PolicyInit, default_device, load_policy

    info = init_distributed(for_deepspeed=cfg.gspo.engine == "deepspeed")
    if cfg.gspo.engine == "torch":
        from components.gspo.distributed import quiet_deepspeed_cpu_warning

        quiet_deepspeed_cpu_warning()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" bars at every checkpoint: progress is ours
    try:
        seed_everything(cfg.gspo.seed + info.rank)
        train_items = items if items is not None else load_train_items(cfg, data_dir)
        device = default_device()
        model, tokenizer = load_policy(cfg.model.name, PolicyInit(lora_rank=cfg.model.lora_rank,
                                       lora_alpha=cfg.model.lora_alpha, seed=cfg.gspo.seed),
                                       cache_dir=cfg.model.cache_dir, dtype=cfg.model.dtype, device=device,
                                       silence_marker=cfg.mas.silence_marker)
        if cfg.model.silence_prior > 0:  # the step-0 policy explores silence (a resume overwrites the weights)
            from components.mas.prior import apply_silence_prior

            reached = apply_silence_prior(model, tokenizer, cfg.mas, train_items, cfg.model.silence_prior,
                                          cfg.model.silence_calibration)
            if info.is_main:
                print(f"silence prior: P(silence first) = {reached:.3f} (model.silence_prior "
                      f"{cfg.model.silence_prior})", file=sys.stderr)
        if cfg.model.gradient_checkpointing:
            # transformers 5.24 renamed it (the old name warns); a GPU host's older 5.x has only the old one
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable()
        engine = build_engine(model, cfg.gspo, cfg.deepspeed, total_steps=planned_updates(cfg.gspo))
        env = Environment(RolloutEngine(engine.module, tokenizer, cfg.mas, device=device))
        trainer = GSPOTrainer(cfg, engine, env, train_items, info, pad_id=int(tokenizer.pad_token_id))
        run_id = None
        ckpt = latest_checkpoint(out) if resume else None
        if ckpt is not None:
            extra = load_checkpoint(ckpt, engine)  # its state and settings were checked before the model loaded
            load_train_state(trainer, extra, ckpt)
            run_id = extra.get("mlflow_run_id")
            if info.is_main:
                print(f"resumed from {ckpt} at step {trainer.step_idx}", file=sys.stderr)
        elif overwrite and info.is_main:
            delete_earlier_run(out)
        if ckpt is None and cfg.budget.enabled and cfg.budget.fraction is not None:  # a resumed run restores B
            mean = trainer.calibrate_budget(cfg.budget.fraction, cfg.budget.calibration_questions)
            if info.is_main:
                print(f"budget: untrained policy {mean:.1f} {cfg.reward.token_measure} tokens/episode over "
                      f"{cfg.budget.calibration_questions} x {cfg.gspo.group_size} sampled training episodes; "
                      f"B = {cfg.budget.fraction:g} x {mean:.1f} = {trainer.controller.target:.1f}", file=sys.stderr)
        pending = extra.get("mlflow_pending", []) if ckpt is not None else []
        # everything alive now (libraries, model, data) lives until the end: a full garbage collection
        # in a step would rescan it all (~0.2 s per collection with torch + transformers loaded)
        gc.freeze()
        use_tracker = track and info.is_main
        with _maybe_tracker(cfg, use_tracker, f"train-{cfg.profile}", run_id) as tracker, \
                _outbox(tracker, pending) as outbox:
            if tracker is not None and tracker.run_id != run_id:  # a new run (also one replacing a lost run)
                tracker.log_params(cfg.flat())
            first_step = trainer.step_idx
            steps = leaf("train", total - first_step, "steps")  # lines inside a step (components.progress)
            while trainer.step_idx < total:
                with steps.active():
                    steps.detail = f"step {trainer.step_idx + 1}/{total}"
                    res = trainer.train_step()
                done_ms = int(time.time() * 1000)
                if info.is_main:
                    print(_progress_line(res.step, total, res.metrics), flush=True)
                steps.advance(shown=True)
                if on_step is not None:
                    on_step(res.step, res.metrics)
                if res.step % cfg.gspo.checkpoint_every == 0 or res.step == total:
                    unsent = outbox.pending() + [(res.step, done_ms, dict(res.metrics))] if outbox else []
                    extra = trainer.state() | {"mlflow_run_id": getattr(tracker, "run_id", run_id),
                                               "mlflow_pending": unsent}
                    save_checkpoint(out, res.step, engine, tokenizer, extra=extra, keep=cfg.gspo.keep_checkpoints)
                if outbox is not None:  # after the checkpoint: sending can never cost one
                    outbox.put(res.step, res.metrics, done_ms)
            result = TrainResult(out, None, trainer.step_idx, trainer.history, getattr(tracker, "run_id", None))
            _finalise(cfg, out, engine, tokenizer, trainer, tracker, result, outbox,  # collective: every rank
                      trained_now=trainer.step_idx > first_step)
        return result
    finally:
        shutdown_distributed()


@contextlib.contextmanager
def _outbox(tracker: Any, pending: list[Any]) -> Iterator[Any]:
    """The metric outbox of ``tracker`` (None without one), holding what a crashed run had not sent."""
    if tracker is None:
        yield None
        return
    from components.tracking.outbox import MetricOutbox

    outbox = MetricOutbox(tracker)
    try:
        outbox.restore(pending)
        yield outbox
    finally:
        outbox.close()


def _registered_by_this_run(final: Path, cfg: Config, run_id: str | None) -> Any:
    """The registry version this same MLflow run already made from ``final``, if it still exists
    (:class:`components.tracking.versions.VersionRef`), else None."""
    from components.tracking.versions import REGISTERED_FILE, registration_of

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


def _finalise(cfg: Config, out: Path, engine: Any, tokenizer: Any, trainer: Any, tracker: Any,
              result: TrainResult, outbox: Any = None, *, trained_now: bool = True) -> None:
    """Final policy folder, metrics.json (DVC), plots, MLflow model + registry version.

    Called on every rank: under ZeRO-3 gathering the full parameters is a collective that every
    rank must enter (rank 0 alone would wait forever for the others). Only rank 0 writes.
    ``trained_now`` False (a retry that resumed at the last step, e.g. after its first attempt
    failed while reporting): the version that run registered is kept, not registered twice.
    """
    from components.gspo.distributed import barrier
    from components.gspo.plots import write_training_plots
    from components.io import atomic_dir, naming_environment_errors, write_json_atomic

    final = out / "final"
    main = engine.dist.is_main
    earlier = None
    if main and not trained_now and tracker is not None and cfg.tracking.log_model:
        earlier = _registered_by_this_run(final, cfg, tracker.run_id)  # read before final/ is rewritten
    with engine.gathered_parameters(), (atomic_dir(final) if main else contextlib.nullcontext()) as tmp:
        if main:
            # a full disk / quota / read-only file system is exit 2 naming final/, also when transformers or
            # tokenizers wrap it in their own error; checked inside, before the staging folder's cleanup frees space
            with naming_environment_errors(final, device=out):
                module = engine.module
                if cfg.model.lora_rank and hasattr(module, "merge_and_unload"):
                    module = module.merge_and_unload()  # a plain HF folder: evaluation needs no peft
                module.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
    barrier()  # no rank leaves (and tears the process group down) while rank 0 may still need it
    if not main:
        return
    result.final_model = final
    last = trainer.history[-1] if trainer.history else {}
    first = trainer.history[0] if trainer.history else {}
    summary = {"steps": trainer.step_idx, "config_hash": cfg.hash(), "budget_calibration": trainer.budget_calibration,
               "final": {k: v for k, v in last.items() if "/" in k and not k.startswith("silence/")},
               "first": {k: v for k, v in first.items() if "/" in k and not k.startswith("silence/")}}
    with naming_environment_errors(out / "metrics.json", device=out):
        write_json_atomic(out / "metrics.json", summary)
    with naming_environment_errors(out / "history.json", device=out):
        write_json_atomic(out / "history.json", trainer.history)
    with naming_environment_errors(out / "plots", device=out):
        result.plots = write_training_plots(trainer.history, out / "plots")
    if tracker is None:
        return
    from components.tracking.outbox import retry_until

    deadline = time.monotonic() + cfg.tracking.outage_wait_s
    if outbox is not None and not outbox.drain(cfg.tracking.outage_wait_s):
        from components.tracking import TrackingError

        raise TrackingError(
            f"training finished ({trainer.step_idx} steps; checkpoints and {final} are saved), but the tracking "
            f"server did not take the metrics of {len(outbox.pending())} step(s) within tracking.outage_wait_s="
            f"{cfg.tracking.outage_wait_s:g} s ({outbox.last_error}); once it is back, rerun with --resume to log "
            f"them and the model (nothing is retrained)")
    for path in result.plots:
        retry_until(lambda path=path: tracker.log_artifact(path, "plots"), deadline)
    retry_until(lambda: tracker.log_artifact(out / "history.json"), deadline)
    if cfg.tracking.log_model:
        from components.data.prepare import manifest_sha256
        from components.tracking import git_commit
        from components.tracking.served import system_settings

        commit = git_commit()
        tags = {"config.sha256": cfg.hash(), "git.commit": commit or "unknown",
                "data.manifest_sha256": manifest_sha256(Path(cfg.data.out_dir)) or "missing",
                "config.profile": cfg.profile,
                "train.run_id": tracker.run_id, "train.steps": str(trainer.step_idx)}
        settings = system_settings(cfg, git_commit=commit)
        if earlier is not None:
            result.model_version = earlier.version
            print(f"{cfg.registry.model_name} version {earlier.version} was registered by this run already "
                  "(resumed at its last step): not registered again", file=sys.stderr)
        else:
            version = retry_until(lambda: tracker.log_policy_model(final, registered_name=cfg.registry.model_name,
                                                                  tags=tags, settings=settings), deadline)
            result.model_version = str(getattr(version, "version", version))
        from components.tracking.versions import VersionRef, write_registration

        write_registration(final, VersionRef(cfg.registry.model_name, result.model_version), uri=cfg.tracking.uri,
                           run_id=tracker.run_id)
        print(f"registered {cfg.registry.model_name} version {result.model_version}", file=sys.stderr)




def history_table(history: list[dict[str, float]], keys: list[str]) -> str:
    """A small markdown table of selected metrics per step (for Prefect artifacts / logs)."""
    head = "| step | " + " | ".join(keys) + " |\n|---|" + "---|" * len(keys) + "\n"
    rows = "".join(f"| {int(h['step'])} | " + " | ".join(f"{h.get(k, float('nan')):.4g}" for k in keys) + " |\n"
                   for h in history)
    return head + rows


def main(argv: list[str] | None = None) -> int:
    """``python -m components.gspo.job`` is what launchers run on every rank (see train_main)."""
    import argparse

    from components.config import load_config

    p = argparse.ArgumentParser(prog="agent-gspo-train", description="GSPO training (one rank)")
    p.add_argument("--params", default=None)
    p.add_argument("--profile", default=None)
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--resume", action="store_true")
    p.add_argument("--overwrite", action="store_true", help="delete the checkpoints and outputs in --out, start over")
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--no-track", action="store_true")
    args = p.parse_args(argv)

    if os.environ.get("RANK", "0") == "0":  # one rank's progress lines (the launcher streams them)
        log_to_stderr()

    def command() -> int:
        cfg = load_config(args.params, args.profile, args.overrides)
        t0 = time.perf_counter()
        if args.resume and args.overwrite:
            raise UserError("--resume and --overwrite exclude each other")
        res = train(cfg, resume=args.resume, overwrite=args.overwrite, max_steps=args.max_steps, out_dir=args.out,
                    track=not args.no_track)
        if res.final_model is not None:
            print(json.dumps({"final_model": str(res.final_model), "steps": res.steps, "run_id": res.run_id,
                              "model_version": res.model_version, "seconds": round(time.perf_counter() - t0, 1)}))
        return 0

    return run_command("agent-gspo train", command, resumable=True)
