"""One training run, on every rank: config in, checkpoints + final policy + metrics + MLflow run out.

The loop around :meth:`components.gspo.trainer.GSPOTrainer.train_step`: load the policy (adding
the silence token), apply the silence prior, calibrate B when ``budget.fraction`` is set,
checkpoint, and write the final model. Where it runs (this process, a subprocess, ``torchrun`` /
``deepspeed`` ranks) is :class:`components.jobs.train.TrainJob`'s decision; launchers run
:func:`main` on every rank (:mod:`components.runtime.train_main`).

Runs identically as one CPU process, under ``torchrun`` / the ``deepspeed`` launcher on CPU
(gloo) or on GPU nodes: every rank calls :func:`train`; rank 0 alone writes the final model,
metrics, plots and talks to MLflow (:mod:`components.runtime.run_tracking`). With
``resume=True`` the newest complete checkpoint under ``out_dir`` is restored (weights, optimizer,
scheduler, RNG, dual state, data cursor, history) and, because rollouts are seeded per step, the
run continues exactly as if never interrupted. A fresh run refuses a folder that holds checkpoints
or an earlier run's outputs (``final/``, ``metrics.json``, ...) unless ``overwrite=True``
(``--overwrite``), which deletes them all first.
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
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from components.config import Config, load_config
from components.data.item import Item
from components.data.train_items import load_train_items
from components.errors import OneLineParser, UserError, run_command
from components.gspo.trainer import GSPOTrainer, noop_reason, seed_everything
from components.io import atomic_dir, check_writable_dir, naming_environment_errors, write_json_atomic
from components.mas.engine import RolloutEngine
from components.mas.environment import Environment
from components.mas.prior import apply_silence_prior
from components.models import PolicyInit, default_device, load_policy
from components.progress import leaf, log_to_stderr
from components.runtime.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from components.runtime.distributed import (
    DistInfo,
    barrier,
    init_distributed,
    quiet_deepspeed_cpu_warning,
    shutdown_distributed,
)
from components.runtime.engines import TrainEngine, build_engine, planned_updates
from components.runtime.plots import write_training_plots
from components.runtime.resume import check_resume_config, config_fields, load_train_state
from components.runtime.run_folder import check_fresh_start, check_resumable, delete_earlier_run, exclusive

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from components.runtime.run_tracking import RunTracking
    from components.tracking.outbox import Row

StepCallback = Callable[[int, dict[str, float]], None]


class TrainOptions(TypedDict, total=False):
    """The keyword options of :func:`train` (see :class:`RunOptions` for their defaults)."""

    resume: bool
    overwrite: bool
    max_steps: int | None
    out_dir: str | Path | None
    data_dir: Path | None
    track: bool
    on_step: StepCallback | None
    items: list[Item] | None


@dataclass(frozen=True)
class RunOptions:
    """How to run a training: :class:`TrainOptions` with their defaults."""

    resume: bool = False
    """continue from the newest checkpoint in the run folder"""
    overwrite: bool = False
    """delete the run folder's checkpoints and outputs first"""
    max_steps: int | None = None
    """stop after this many steps (default ``gspo.steps``)"""
    out_dir: str | Path | None = None
    """the run folder (default ``gspo.out_dir``)"""
    data_dir: Path | None = None
    """prepared data (default ``data.out_dir``)"""
    track: bool = True
    """an MLflow run (rank 0) and a registered final policy"""
    on_step: StepCallback | None = None
    """called with each step's number and metrics"""
    items: list[Item] | None = None
    """training questions (default: ``data.train_sources``)"""


@dataclass
class TrainResult:
    out_dir: Path
    final_model: Path | None
    steps: int
    history: list[dict[str, float]] = field(default_factory=list)
    run_id: str | None = None
    model_version: str | None = None
    plots: list[Path] = field(default_factory=list)


@dataclass(frozen=True)
class _Run:
    """What a training run built: its config and folder, the engine, the tokenizer, the trainer."""

    cfg: Config
    out: Path
    engine: TrainEngine
    tokenizer: PreTrainedTokenizerBase
    trainer: GSPOTrainer


def _progress_line(step: int, total: int, m: dict[str, float]) -> str:
    return (f"step {step}/{total}  reward {m.get('train/reward', 0):+.3f}  acc {m.get('train/accuracy', 0):.2f}  "
            f"tokens {m.get('train/budget_tokens', 0):.0f}/{m.get('train/budget', 0):.0f}  "
            f"λ {m.get('train/lambda_tok', 0):.3f}  silence {m.get('train/silence_rate', 0):.2f}  "
            f"clip {m.get('gspo/clip_frac_low', 0) + m.get('gspo/clip_frac_high', 0):.3f}  "
            f"{m.get('perf/rollout_tokens_per_s', 0):.0f} tok/s  {m.get('perf/step_s', 0):.1f} s/step"
            + _memory_part(m) + _noop_part(m))


def _noop_part(m: dict[str, float]) -> str:
    """``  no-op: all 4 advantage groups zero`` when the update could not move the policy."""
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


def train(cfg: Config, **options: Unpack[TrainOptions]) -> TrainResult:
    """Run (or resume) GSPO training as configured; see the module docstring and :class:`RunOptions`."""
    opts = RunOptions(**options)
    out = Path(opts.out_dir or cfg.gspo.out_dir)
    total = opts.max_steps if opts.max_steps is not None else cfg.gspo.steps
    if total < 1:
        raise UserError(f"--max-steps must be >= 1, got {total}")

    check_writable_dir(out, "training output folder (--out / gspo.out_dir)")
    with exclusive(out):
        check_fresh_start(out, opts.resume, opts.overwrite)
        if opts.resume:
            check_resumable(out, cfg)
        return _train(cfg, out, total, opts)


def _build(cfg: Config, out: Path, items: list[Item], info: DistInfo) -> _Run:
    """The policy (silence token added, prior applied), its engine and the trainer over them."""
    device = default_device()
    model, tokenizer = load_policy(cfg.model.name, PolicyInit(lora_rank=cfg.model.lora_rank,
                                   lora_alpha=cfg.model.lora_alpha, seed=cfg.gspo.seed),
                                   cache_dir=cfg.model.cache_dir, dtype=cfg.model.dtype, device=device,
                                   silence_marker=cfg.mas.silence_marker)
    if cfg.model.silence_prior > 0:  # the step-0 policy explores silence (a resume overwrites the weights)
        reached = apply_silence_prior(model, tokenizer, cfg.mas, items, cfg.model.silence_prior,
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
    trainer = GSPOTrainer(cfg, engine, env, items, info, pad_id=int(tokenizer.pad_token_id))
    return _Run(cfg, out, engine, tokenizer, trainer)


def _start(run: _Run, opts: RunOptions) -> dict[str, Any]:
    """Restore the newest checkpoint (``--resume``) or start fresh; returns the restored state ({} if none)."""
    cfg, trainer, main = run.cfg, run.trainer, run.engine.dist.is_main
    ckpt = latest_checkpoint(run.out) if opts.resume else None
    if ckpt is not None:
        extra = load_checkpoint(ckpt, run.engine)  # its state and settings were checked before the model loaded
        check_resume_config(extra, cfg)
        load_train_state(trainer, extra, ckpt)
        if main:
            print(f"resumed from {ckpt} at step {trainer.step_idx}", file=sys.stderr)
        return extra
    if opts.overwrite and main:
        delete_earlier_run(run.out)
    if cfg.budget.enabled and cfg.budget.fraction is not None:  # a resumed run restores B
        mean = trainer.calibrate_budget(cfg.budget.fraction, cfg.budget.calibration_questions)
        if main:
            print(f"budget: untrained policy {mean:.1f} {cfg.reward.token_measure} tokens/episode over "
                  f"{cfg.budget.calibration_questions} x {cfg.gspo.group_size} sampled training episodes; "
                  f"B = {cfg.budget.fraction:g} x {mean:.1f} = {trainer.controller.target:.1f}", file=sys.stderr)
    return {}


@contextlib.contextmanager
def _tracking(run: _Run, enabled: bool, run_id: str | None, pending: list[Row]) -> Iterator[RunTracking | None]:
    """The MLflow side (None without tracking: then MLflow is never imported)."""
    if not enabled:
        yield None
        return
    from components.runtime.run_tracking import tracking  # loads mlflow

    with tracking(run.cfg, f"train-{run.cfg.profile}", run_id, pending) as tracked:
        yield tracked


def _train(cfg: Config, out: Path, total: int, opts: RunOptions) -> TrainResult:
    """:func:`train` once the folder is checked and held."""
    info = init_distributed(for_deepspeed=cfg.gspo.engine == "deepspeed")
    if cfg.gspo.engine == "torch":
        quiet_deepspeed_cpu_warning()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" bars at every checkpoint: progress is ours
    try:
        seed_everything(cfg.gspo.seed + info.rank)
        run = _build(cfg, out, opts.items if opts.items is not None else load_train_items(cfg, opts.data_dir), info)
        trainer = run.trainer
        restored = _start(run, opts)
        run_id = restored.get("mlflow_run_id")
        # everything alive now (libraries, model, data) lives until the end: a full garbage collection
        # in a step would rescan it all (~0.2 s per collection with torch + transformers loaded)
        gc.freeze()
        with _tracking(run, opts.track and info.is_main, run_id, restored.get("mlflow_pending", [])) as tracked:
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
                if opts.on_step is not None:
                    opts.on_step(res.step, res.metrics)
                if res.step % cfg.gspo.checkpoint_every == 0 or res.step == total:
                    unsent = tracked.outbox.pending() + [(res.step, done_ms, dict(res.metrics))] if tracked else []
                    extra = trainer.state() | config_fields(cfg) | {
                        "mlflow_run_id": tracked.tracker.run_id if tracked else run_id, "mlflow_pending": unsent}
                    save_checkpoint(out, res.step, run.engine, run.tokenizer, extra=extra,
                                    keep=cfg.gspo.keep_checkpoints)
                if tracked is not None:  # after the checkpoint: sending can never cost one
                    tracked.outbox.put(res.step, res.metrics, done_ms)
            result = TrainResult(out, None, trainer.step_idx, trainer.history,
                                 tracked.tracker.run_id if tracked else None)
            _finalise(run, tracked, result, trained_now=trainer.step_idx > first_step)  # collective: every rank
        return result
    finally:
        shutdown_distributed()


def _finalise(run: _Run, tracked: RunTracking | None, result: TrainResult, *, trained_now: bool = True) -> None:
    """Final policy folder, metrics.json (DVC), plots, MLflow model + registry version.

    Called on every rank: under ZeRO-3 gathering the full parameters is a collective that every
    rank must enter (rank 0 alone would wait forever for the others). Only rank 0 writes.
    ``trained_now`` False (a retry that resumed at the last step, e.g. after its first attempt
    failed while reporting): the version that run registered is kept, not registered twice.
    """
    cfg, out, engine, trainer = run.cfg, run.out, run.engine, run.trainer
    final = out / "final"
    main = engine.dist.is_main
    earlier = None
    if main and not trained_now and tracked is not None and cfg.tracking.log_model:
        earlier = tracked.registered_by_this_run(final, cfg)  # read before final/ is rewritten
    with engine.gathered_parameters(), (atomic_dir(final) if main else contextlib.nullcontext()) as tmp:
        if main:
            # a full disk / quota / read-only file system is exit 2 naming final/, also when transformers or
            # tokenizers wrap it in their own error; checked inside, before the staging folder's cleanup frees space
            with naming_environment_errors(final, device=out):
                module = engine.module
                if cfg.model.lora_rank and hasattr(module, "merge_and_unload"):
                    module = module.merge_and_unload()  # a plain HF folder: evaluation needs no peft
                module.save_pretrained(tmp)
                run.tokenizer.save_pretrained(tmp)
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
    if tracked is not None:
        result.model_version = tracked.report_final(cfg, out, result.plots, trainer.step_idx, earlier)


def history_table(history: list[dict[str, float]], keys: list[str]) -> str:
    """A small markdown table of selected metrics per step (for Prefect artifacts / logs)."""
    head = "| step | " + " | ".join(keys) + " |\n|---|" + "---|" * len(keys) + "\n"
    rows = "".join(f"| {int(h['step'])} | " + " | ".join(f"{h.get(k, float('nan')):.4g}" for k in keys) + " |\n"
                   for h in history)
    return head + rows


def main(argv: list[str] | None = None) -> int:
    """``python -m components.runtime.train_main`` is what launchers run on every rank."""
    p = OneLineParser(prog="agent-gspo-train", description="GSPO training (one rank)")
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
