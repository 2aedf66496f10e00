"""`agent-gspo experiments run`: train / evaluate each experiment and write ``results/<name>.json``.

Per experiment (in process, one after the other; the definitions are in :mod:`.definitions`):

* ``baselines`` kind: evaluate the configured base model as single-agent CoT, self-consistency and
  the untrained free-for-all MAS (``eval.baselines``) - no ``agent_gspo`` system, which before
  training is the same weights and topology as ``mas_untrained`` and would only double the cost;
* ``gspo`` kind: :func:`components.runtime.training_run.train` (its own MLflow run, checkpoints, plots,
  registered model), then evaluate the run's final folder ALONE (no baselines) - an MLflow run too.

Both evaluate the same seeded sample (``eval.limit`` items per benchmark with ``eval.seed``; the
definitions may not override ``eval.*``), or with ``experiments.eval_split=devset`` the dev set
(components/data/devset.py: items disjoint from that sample, to choose recipes on). A
``budget_fraction`` experiment trains with ``budget.fraction``: B is measured by the trainer before
step 1 on sampled training episodes of the untrained policy and recorded in the results file
(:func:`.definitions.budget_from_calibration`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from components.config import Config
from components.data.outputs import manifest_sha256
from components.data.sampling import DEVSET
from components.evaluation import EvalRequest, build_systems, evaluate
from components.evaluation.runner import EvalReport
from components.evaluation.setting import item_ids_sha256
from components.io import check_not_pipeline_input, check_output_file, check_writable_dir
from components.machine import machine_fingerprint
from components.models import PolicyInit, default_device, load_policy
from components.redact import redact
from components.runtime.checkpoint import latest_checkpoint, step_of
from components.runtime.training_run import train
from components.tracking import Tracker, git_commit
from experiments.carry import merge_carried, plan_carry, with_systems
from experiments.definitions import (
    Experiment,
    ExperimentError,
    budget_from_calibration,
    budget_overrides,
    experiment_config,
    read_calibration,
    select,
    settings_of,
)
from experiments.proof import ProofResults, RunContext, proof_config, run_proof
from experiments.results import ResultsFile, load_results, write_results
from experiments.schema import study_section
from experiments.stats import ItemColumns

Log = Callable[[str], None]


@dataclass(frozen=True)
class RunRequest:
    """What one ``experiments run`` asks for (the CLI's options; :class:`experiments.jobs.ExperimentsJob`)."""

    only: Sequence[str] | None = None
    """experiment names (default: all)"""
    limit: int | None = None
    """items per benchmark, overriding eval.limit for every experiment"""
    results_dir: str | Path | None = None
    """default experiments.results_dir"""
    user_overrides: Sequence[str] = ()
    """--set overrides, re-applied after each experiment's own"""
    data_dir: str | Path | None = None
    """default data.out_dir"""
    track: bool = True
    log: Log = print
    params: str | None = None
    """the params file the config came from (a proof loads its own profile from it)"""
    resume: bool = False


@dataclass
class ExperimentOutcome:
    """What :func:`run_experiments` did for one experiment."""

    name: str
    path: Path
    results: ResultsFile | ProofResults
    """a ResultsFile, or a ProofResults for the proof kind"""


@contextlib.contextmanager
def _tracker(cfg: Config, enabled: bool, run_name: str, tags: dict[str, Any]) -> Iterator[Tracker | None]:
    if not enabled:
        yield None
        return
    with Tracker.from_config(cfg, run_name, tags) as tracker:
        yield tracker


def _evaluate_baselines(cfg: Config, data_dir: Path, tracker: Tracker | None, split: str) -> EvalReport:
    """Evaluate ``eval.baselines`` of the base model (injected systems: no ``agent_gspo``) on ``split``."""
    device = default_device()
    policy = load_policy(cfg.model.name, PolicyInit(seed=cfg.gspo.seed), cache_dir=cfg.model.cache_dir,
                         dtype=cfg.model.dtype, device=device, silence_marker=cfg.mas.silence_marker)
    systems = build_systems(cfg, policy, cfg.eval.baselines, device=device)[1:]
    return evaluate(cfg, EvalRequest(model=cfg.model.name, data_dir=data_dir, out_dir=Path(cfg.eval.out_dir),
                                     split=split), systems=systems, tracker=tracker)


def _set_run_tag(cfg: Config, run_id: str | None, name: str) -> None:
    if run_id is None:
        return
    from mlflow import MlflowClient

    MlflowClient(tracking_uri=cfg.tracking.uri).set_tag(run_id, "experiment.name", name)


def run_one(cfg: Config, exp: Experiment, overrides: Sequence[str], ctx: RunContext,
            resume: bool = False) -> ResultsFile:
    """Run one experiment under its resolved ``cfg``; returns the (unwritten) results.

    ``ctx.commit``: the git commit of the code that runs, taken when the run STARTED (HEAD may move
    while a long run is going); default: HEAD now. ``resume``: a ``gspo`` experiment whose run
    folder holds a complete checkpoint continues from the newest one (the trainer refuses one of
    another config: its hash is checked) instead of training from scratch; the evaluation always
    runs in full. ``train_seconds`` / ``wall_seconds`` then count this process only, and
    ``resumed_from_step`` says from where."""
    data_dir, track, log = ctx.data_dir, ctx.track, ctx.log
    commit = ctx.commit or git_commit()

    t0 = time.perf_counter()
    history: list[dict[str, float]] = []
    train_s: float | None = None
    trained: str | None = None
    budget = None
    resumed_from: int | None = None
    ids = {"train_run_id": None, "eval_run_id": None, "model_version": None}
    split = study_section(cfg).eval_split
    tags = {"stage": "evaluate", "experiment.name": exp.name, "eval.split": split}
    if exp.kind == "baselines":
        what = "the dev set" if split == DEVSET else f"{cfg.eval.limit or 'all'} items"
        log(f"[{exp.name}] evaluating {', '.join(cfg.eval.baselines)} of {cfg.model.name} "
            f"({what} x {len(cfg.eval.benchmarks)} benchmarks)")
        with _tracker(cfg, track, f"evaluate-{exp.name}", tags) as tracker:
            report = _evaluate_baselines(cfg, data_dir, tracker, split)
            ids["eval_run_id"] = getattr(tracker, "run_id", None)
    else:
        log(f"[{exp.name}] training {cfg.gspo.steps} step(s) into {cfg.gspo.out_dir}"
            + (f" with B = {cfg.budget.fraction:g} x the untrained policy's {cfg.reward.token_measure} tokens per "
               "sampled training episode" if cfg.budget.fraction is not None and cfg.budget.enabled else ""))
        # without resume an experiment (re)run trains from scratch: the folder's earlier checkpoints are its own
        resumed_from = _resume_point(Path(cfg.gspo.out_dir)) if resume else None
        if resumed_from is not None:
            log(f"[{exp.name}] resuming training from step {resumed_from} (newest checkpoint in {cfg.gspo.out_dir})")
        result = train(cfg, out_dir=cfg.gspo.out_dir, data_dir=data_dir, track=track,
                       resume=resumed_from is not None, overwrite=resumed_from is None)
        train_s = time.perf_counter() - t0
        if cfg.budget.fraction is not None and cfg.budget.enabled:
            where = f"{cfg.gspo.out_dir}/metrics.json"
            budget = budget_from_calibration(read_calibration(cfg.gspo.out_dir), cfg, where)
            log(f"[{exp.name}] B = {budget.fraction:g} x {budget.baseline_mean:.1f} ({budget.figure}) "
                f"= {budget.target:.1f} {budget.measure} tokens/episode")
        history = [{k: float(v) for k, v in h.items()} for h in result.history]
        trained = str(result.final_model)
        ids.update(train_run_id=result.run_id, model_version=result.model_version)
        if track:
            _set_run_tag(cfg, result.run_id, exp.name)
        log(f"[{exp.name}] evaluating the trained policy {trained} on {split}")
        with _tracker(cfg, track, f"evaluate-{exp.name}", tags | {"eval.model": trained}) as tracker:
            report = evaluate(cfg, EvalRequest(model=trained, baselines=[], data_dir=data_dir,
                              out_dir=Path(cfg.eval.out_dir), split=split), tracker=tracker)
            ids["eval_run_id"] = getattr(tracker, "run_id", None)
    wall = time.perf_counter() - t0
    cells: dict[str, dict[str, Any]] = {}
    for row in report.table:
        cells.setdefault(row.system, {})[row.benchmark] = row.numbers()
    items = {system: {bench: ItemColumns(correct=[o.correct for o in outs], tokens_total=[o.tokens_total for o in outs],
                                         tokens_completion=[o.tokens_completion for o in outs])
                      for bench, outs in per_bench.items()} for system, per_bench in report.per_item.items()}
    meta = report.meta
    return ResultsFile.model_validate({
        "schema_version": 1, "name": exp.name, "kind": exp.kind, "label": exp.label,
        "description": exp.description, "extends": exp.extends, "overrides": list(overrides),
        "profile": cfg.profile, "config_hash": cfg.hash(), "data_manifest_sha256": meta.get("data_manifest_sha256"),
        "model": cfg.model.name, "trained_model": trained, "seed": cfg.gspo.seed, "eval_seed": cfg.eval.seed,
        "limit": meta.get("limit"), "benchmarks": list(cfg.eval.benchmarks),
        "item_ids_sha256": item_ids_sha256(meta["item_ids"]), "eval_split": split, "devset": meta.get("devset"),
        "settings": settings_of(cfg), "budget": budget,
        "last_k": study_section(cfg).last_k, "git_commit": commit, "wall_seconds": round(wall, 1),
        "train_seconds": None if train_s is None else round(train_s, 1),
        "eval_seconds": round(wall - (train_s or 0), 1), "resumed_from_step": resumed_from,
        "mlflow": ids, "eval": cells, "summary": report.summary, "history": history, "items": items,
        "silence": {name: {"silent": g.silent, "sent": g.total} | _silence_more(report, name)
                    for name, g in report.silence_grids.items()},
        "machine": meta.get("machine"),
        "self_consistency_k": cfg.eval.self_consistency_k if "self_consistency" in cells else None,
    })


def _silence_more(report: EvalReport, system: str) -> dict[str, Any]:
    """The optional parts of a results file's silence: per benchmark and by condition (issue 52)."""
    if system not in report.silence_more:
        return {}
    grids, content = report.silence_more[system]
    return {"by_benchmark": {b: {"silent": g.silent, "sent": g.total} for b, g in grids.items()},
            "content": asdict(content)}


def _keepable(cfg: Config, path: Path, data_dir: Path, log: Log) -> tuple[ResultsFile, list[str]] | None:
    """The existing baselines file whose systems ``--resume`` keeps and the systems it lacks (checked
    before anything runs: :func:`experiments.carry.plan_carry`), or None when there is none yet."""
    if not path.exists():
        log(f"[{path.stem}] no {path} to keep systems from (--resume): evaluating every system")
        return None
    existing = load_results(path)
    return existing, plan_carry(cfg, existing, path, manifest_sha256=manifest_sha256(data_dir),
                                machine=machine_fingerprint())


def _resume_point(out: Path) -> int | None:
    """The step of the newest complete checkpoint in a run folder, or None (nothing to resume)."""
    newest = latest_checkpoint(out)
    return None if newest is None else step_of(newest)


def _recordable(override: str) -> str:
    """An override as stored in a committed results file: a tracking URI is machine-local, so its
    value is dropped; any other value has its URI passwords replaced by ``***``."""
    key = override.split("=", 1)[0].strip()
    return f"{key}=<not recorded>" if key == "tracking.uri" else redact(override)


def run_experiments(base: Config, request: RunRequest) -> list[ExperimentOutcome]:
    """Run the selected experiments (all by default) and write ``<results_dir>/<name>.json`` each.

    ``base`` is the config with the profile and ``request.user_overrides`` applied; the overrides are
    applied again after each experiment's own, so ``--set`` wins over a definition. ``request.limit``
    overrides ``eval.limit`` for every experiment (the baselines file must then match it). ``request.resume``:
    an interrupted ``gspo`` experiment continues from its newest checkpoint (:func:`run_one`); a baselines
    experiment keeps the systems its results file holds and evaluates only the missing ones (:mod:`.carry`:
    same config but for ``eval.baselines``, same data and machine, or it is refused before anything runs);
    proof experiments run in full.
    """
    req, log = request, request.log
    user = list(req.user_overrides) + ([f"eval.limit={req.limit}"] if req.limit is not None else [])
    if req.limit is not None:
        base = base.model_copy(update={"eval": base.eval.model_copy(update={"limit": req.limit})})
    results = Path(req.results_dir or study_section(base).results_dir)
    if req.limit is not None and study_section(base).eval_split == DEVSET:
        raise ExperimentError(f"--limit {req.limit} with experiments.eval_split=devset: the dev set excludes the "
                              f"test sample of eval.limit ({base.eval.limit}); another limit would exclude other "
                              "items, and the dev items would no longer be disjoint from the reported test sample")
    data = Path(req.data_dir or base.data.out_dir)
    outcomes: list[ExperimentOutcome] = []
    commit = git_commit()  # the code that runs: HEAD may move during a run of hours
    selected = select(base, req.only)
    # the results folder, and every selected definition, are checked before the first one runs: a
    # bad override in the last experiment, or a --results that cannot be written, must not surface
    # after hours of compute
    check_not_pipeline_input(results, "results folder (--results / experiments.results_dir)")
    check_writable_dir(results, "results folder (--results / experiments.results_dir)")
    for exp in selected:
        check_output_file(results / f"{exp.name}.json", "results file")
    configs = {exp.name: proof_config(req.params, exp, str(exp.profile), user) if exp.kind == "proof"
               else experiment_config(base, exp, user_overrides=user) for exp in selected}
    kept = {exp.name: _keepable(configs[exp.name], results / f"{exp.name}.json", data, log)
            for exp in selected if req.resume and exp.kind == "baselines"}
    ctx = RunContext(data_dir=data, track=req.track, log=log, commit=commit)
    for exp in selected:
        cfg = configs[exp.name]
        if exp.kind == "proof":  # its own profile and task: see experiments/proof.py
            if req.resume:
                log(f"[{exp.name}] --resume applies to gspo experiments only: a proof experiment trains from scratch")
            if study_section(base).eval_split == DEVSET:
                log(f"[{exp.name}] experiments.eval_split=devset does not apply to a proof experiment: it evaluates "
                    "its own task's test split")
            res: ResultsFile | ProofResults = run_proof(cfg, exp, list(exp.overrides) + [_recordable(t) for t in user],
                                 RunContext(data_dir=Path(req.data_dir or cfg.data.out_dir), track=req.track,
                                            log=log, commit=commit))
        else:
            overrides = list(exp.overrides) + [_recordable(t) for t in user] + budget_overrides(exp)
            carry = kept.get(exp.name)
            if carry is not None:  # --resume of a baselines file: evaluate only what it lacks
                old, missing = carry
                if not missing:
                    log(f"[{exp.name}] {results / f'{exp.name}.json'} already holds {', '.join(cfg.eval.baselines)}: "
                        "nothing to evaluate (--resume)")
                    outcomes.append(ExperimentOutcome(exp.name, results / f"{exp.name}.json", old))
                    continue
                log(f"[{exp.name}] keeping {', '.join(s for s in cfg.eval.baselines if s in old.eval)} of "
                    f"{results / f'{exp.name}.json'} (--resume); evaluating {', '.join(missing)}")
                fresh = run_one(with_systems(cfg, missing), exp, overrides, ctx)
                res = merge_carried(cfg, fresh, old)
            else:
                res = run_one(cfg, exp, overrides, ctx, resume=req.resume)
        path = write_results(results / f"{exp.name}.json", res)
        log(f"[{exp.name}] wrote {path} ({res.wall_seconds:.0f} s)")
        outcomes.append(ExperimentOutcome(exp.name, path, res))
    return outcomes
