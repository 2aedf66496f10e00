"""Seven-benchmark evaluation: the trained MAS and its baselines on a seeded sample of TEST items.

Systems (all run by the same batched :class:`components.mas.engine.RolloutEngine`, so token
accounting is identical across them):

* ``agent_gspo``      - the evaluated policy with the configured topology / agents / rounds;
* ``single_cot``      - the evaluated policy, one agent, one round;
* ``self_consistency``- the evaluated policy, ``eval.self_consistency_k`` lone samples, majority vote;
* ``mas_untrained``   - the BASE model (``model.name``) as a free-for-all MAS (complete topology).
  When the evaluated model is the base model it is the same weights, only the topology differs.
* ``mas_prior``       - the base model with the silence prior ``model.silence_prior`` and no RL (the
  step-0 policy of training, see components/mas/prior.py): separates injected from learned silence.

Every MAS runs the configured protocol (``mas.protocol``), so the baselines pay for calls exactly as
the trained system does.

Decoding: ``agent_gspo``, ``single_cot`` and ``mas_untrained`` decode greedily (the deterministic
answer of each system; sampling noise would blur the comparison at small n); self-consistency
must sample to be anything but k copies of CoT, so it samples at ``mas.temperature`` / ``mas.top_p``
with a seed derived from ``eval.seed``, benchmark, system and batch index. Same inputs -> same numbers.

Batching: greedy systems pool the items of all benchmarks into shared engine calls (see
:func:`_run_benchmarks`); self-consistency batches per benchmark. Each batch is rolled out and
voted on at once; grading is deferred: every episode (all systems, all benchmarks) is graded in ONE
call to the one grader (:func:`components.mas.environment.grade_episodes`), so HumanEval programs
run in parallel sandboxes and math-verify runs in its bounded worker pool.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from components.config import ALL_BENCHMARKS, BASELINE_NAMES, Config
from components.data.devset import DEVSET
from components.data.item import Item
from components.data.prepare import manifest_sha256
from components.data.sampling import EVAL_SPLIT, derived_seed
from components.data.train_items import load_train_items
from components.errors import UserError
from components.evaluation.items import (
    ITEMS_PARAM,
    MAIN_PARAM,
    encode,
    items_sha256,
    log_items_table,
    records_of,
)
from components.evaluation.metrics import (
    EpisodeLike,
    EpisodeStats,
    EvalRow,
    SilenceGrid,
    aggregate,
    silence_grid,
    summarise,
)
from components.evaluation.outputs import EvalOutputs, write_outputs
from components.evaluation.publish import check_out_dir, publish
from components.evaluation.report import render_markdown
from components.evaluation.setting import sample_split
from components.evaluation.silence import SilenceContent, silence_details
from components.machine import describe, machine_fingerprint
from components.mas.baselines import baseline_engine
from components.mas.engine import RolloutEngine
from components.mas.environment import grade_episodes
from components.mas.prior import apply_silence_prior
from components.mas.voting import vote
from components.models import ALIASES, PolicyInit, default_device, load_policy
from components.progress import report

if TYPE_CHECKING:
    from components.mas.records import Episode
    from components.tracking.mlflow_logging import Tracker


class Rollouts(Protocol):
    """What evaluation needs of an engine: the multi-agent :class:`components.mas.engine.RolloutEngine`
    and the single-agent baselines all have it."""

    def rollout(self, items: Sequence[Item], group_size: int, *, seed: int, greedy: bool) -> list[Episode]: ...

log = logging.getLogger(__name__)

MAIN_SYSTEM = "agent_gspo"
BASE_WEIGHTS = ("mas_untrained", "mas_prior")
"""baselines that run the untrained base model, not the evaluated policy"""
MAS_SYSTEMS = (MAIN_SYSTEM, *BASE_WEIGHTS)
"""systems whose episodes are agents x rounds of messages (a silence grid means something)"""


class EvalInputError(UserError):
    """Bad evaluation input: unknown benchmark or baseline, missing data, empty system list."""


@dataclass
class System:
    """A named system to evaluate: an engine plus how to decode with it."""

    name: str
    engine: Rollouts
    """a RolloutEngine, or a baseline's engine (anything with :class:`Rollouts`' ``rollout``)"""
    greedy: bool = True


@dataclass
class EvalReport:
    """What :func:`evaluate` returns (and wrote to ``paths``)."""

    table: list[EvalRow]
    """one row per (system, benchmark), systems in run order"""
    markdown: str
    paths: dict[str, Path]
    summary: dict[str, dict[str, Any]]
    """per system: accuracy (macro over benchmarks), tokens_total (sum), ... see metrics.summarise"""
    meta: dict[str, Any]
    silence: SilenceGrid | None = None
    """silence per (agent, round) of the main system"""
    timings: dict[str, float] = field(default_factory=dict)
    """seconds per system (rollouts) and for grading; not part of the reproducible numbers"""
    per_item: dict[str, dict[str, list[ItemOutcome]]] = field(default_factory=dict)
    """system -> benchmark -> one outcome per item, in sample order (for paired comparisons)"""
    silence_grids: dict[str, SilenceGrid] = field(default_factory=dict)
    """silence per (agent, round) of every multi-agent system (:data:`MAS_SYSTEMS`) that ran"""
    silence_more: dict[str, tuple[dict[str, SilenceGrid], SilenceContent]] = field(default_factory=dict)
    """the same systems' grids per benchmark and silence by condition (components/evaluation/silence.py)"""


@dataclass(frozen=True)
class ItemOutcome:
    """One system's result on one item: what a paired comparison between systems needs."""

    id: str
    correct: bool
    tokens_total: int
    tokens_completion: int


def _length_key(item: Item) -> int:
    """Prompt-length proxy (characters of question and options)."""
    return len(item.question) + sum(len(c) for c in item.choices or ())


def run_system(system: System, items: Sequence[Item], *, batch_size: int, seed: int, benchmark: str,
               compact: bool = False) -> list[EpisodeLike]:
    """One episode per item (returned in ``items`` order), ``batch_size`` questions per engine call.
    ``compact`` turns each batch's episodes into :class:`EpisodeStats` at once (bounded memory).

    Items are batched in order of question length (stable sort), so one long question does not
    pad a whole batch: on CPU the prefill is compute-bound and attention over padding is wasted
    (MMLU questions range from ~50 to ~4000 characters). Greedy results do not depend on batch
    composition; sampled ones depend on it deterministically (seed derived per batch index).
    """
    if batch_size < 1:
        raise EvalInputError(f"eval.batch_size must be >= 1, got {batch_size}")
    order = sorted(range(len(items)), key=lambda k: _length_key(items[k]))
    episodes: list[EpisodeLike | None] = [None] * len(items)
    starts = range(0, len(order), batch_size)
    t0, done = time.perf_counter(), 0
    log.info("evaluate %s (%s): %d items in %d batch(es) of up to %d", system.name, benchmark, len(items),
             len(starts), batch_size)
    with report(f"evaluate {system.name} ({benchmark})", len(starts), "batches") as progress:
        for b, start in enumerate(starts):
            idx = order[start:start + batch_size]
            out = _run_batch(system, [items[k] for k in idx], derived_seed(seed, benchmark, system.name, b))
            for k, ep in zip(idx, out, strict=True):
                episodes[k] = EpisodeStats.from_episode(ep) if compact else ep
            done += len(idx)
            progress.advance(detail=f"{done}/{len(items)} items")
    log.info("evaluate %s (%s): %d items done in %.0f s", system.name, benchmark, done, time.perf_counter() - t0)
    return [ep for ep in episodes if ep is not None]


def _run_batch(system: System, batch: list[Item], seed: int) -> list[Any]:
    """One engine call on ``batch`` (sampled with ``seed``), voted: one episode per item, in order."""
    out = system.engine.rollout(batch, 1, seed=seed, greedy=system.greedy)
    if len(out) != len(batch):
        raise EvalInputError(f"system {system.name!r}: engine returned {len(out)} episodes for {len(batch)} items")
    vote(out, batch, system.engine.cfg)
    return out


def _run_benchmarks(system: System, items: dict[str, list[Item]], *, batch_size: int, seed: int,
                    timings: dict[str, float]) -> dict[str, list[EpisodeLike]]:
    """Episodes of one system on every benchmark, ``{benchmark: episodes in item order}``.

    Greedy systems pool the items of ALL benchmarks into shared engine calls (``batch_size``
    questions each, sorted by length): greedy ids do not depend on batch composition, and with a
    few items per benchmark (the smoke set: one each) per-benchmark calls would barely batch.
    Sampled systems keep per-benchmark calls, so each benchmark's sampling stream (seeded by
    benchmark, system and batch index) does not move when another benchmark is added or dropped.
    """
    t0 = time.perf_counter()
    if system.greedy:
        pooled = [item for its in items.values() for item in its]
        eps = run_system(system, pooled, batch_size=batch_size, seed=seed, benchmark="pooled", compact=True)
        out: dict[str, list[EpisodeLike]] = {}
        start = 0
        for b, its in items.items():
            out[b] = eps[start:start + len(its)]
            start += len(its)
    else:
        out = {b: run_system(system, its, batch_size=batch_size, seed=seed, benchmark=b, compact=True)
               for b, its in items.items()}
    timings[system.name] += time.perf_counter() - t0
    return out


def _load(name: str | Path, cfg: Config, device: str):
    return load_policy(str(name), PolicyInit(seed=cfg.gspo.seed), cache_dir=cfg.model.cache_dir, dtype=cfg.model.dtype,
                       device=device, silence_marker=cfg.mas.silence_marker)


def resolve_model(cfg: Config, model: str | None) -> tuple[str, str | Path]:
    """``(uri as given, what load_policy gets)``: aliases pass through, URIs/folders are resolved."""
    uri = model or cfg.model.name
    if uri in ALIASES:
        return uri, uri
    from components.tracking import resolve_model_uri  # lazy: mlflow (~4 s), only for a models:/ URI or run

    return uri, resolve_model_uri(uri, tracking_uri=cfg.tracking.uri)


def build_systems(cfg: Config, policy: tuple[Any, Any], baselines: Sequence[str], *,
                  base: tuple[Any, Any] | None = None, device: str = "cpu", data_dir: Path | None = None,
                  **engine_kw: Any) -> list[System]:
    """Engines for ``agent_gspo`` and each baseline. ``base`` = (model, tokenizer) of the untrained
    model for ``mas_untrained`` / ``mas_prior`` (defaults to ``policy``); ``mas_prior`` gets a copy
    of it with the silence prior, calibrated on ``data.train_sources`` under ``data_dir``;
    ``engine_kw`` goes to every RolloutEngine."""
    kw = {"device": device, **engine_kw}
    systems = [System(MAIN_SYSTEM, RolloutEngine(*policy, cfg.mas, **kw), greedy=True)]
    for name in baselines:
        weights = (base or policy) if name in BASE_WEIGHTS else policy
        if name == "mas_prior":
            weights = _with_prior(cfg, weights, data_dir)
        engine = baseline_engine(name, *weights, cfg.mas, k=cfg.eval.self_consistency_k, **kw)
        systems.append(System(name, engine, greedy=name != "self_consistency"))
    return systems


def _with_prior(cfg: Config, weights: tuple[Any, Any], data_dir: Path | None) -> tuple[Any, Any]:
    """A copy of the base model with the silence prior (the training run's step-0 policy)."""
    import copy

    if cfg.model.silence_prior <= 0:
        raise EvalInputError("baseline mas_prior needs model.silence_prior > 0 (the prior it evaluates)")
    model = copy.deepcopy(weights[0])
    apply_silence_prior(model, weights[1], cfg.mas, load_train_items(cfg, data_dir), cfg.model.silence_prior,
                        cfg.model.silence_calibration)
    return model, weights[1]


def _check_names(benchmarks: Sequence[str], baselines: Sequence[str]) -> None:
    bad = [b for b in benchmarks if b not in ALL_BENCHMARKS]
    if bad:
        raise EvalInputError(f"eval.benchmarks: unknown benchmark(s) {bad} (allowed: {', '.join(ALL_BENCHMARKS)})")
    bad = [b for b in baselines if b not in BASELINE_NAMES]
    if bad:
        raise EvalInputError(f"eval.baselines / --baselines: unknown baseline(s) {bad} "
                             f"(allowed: {', '.join(BASELINE_NAMES)})")
    if not benchmarks:
        raise EvalInputError("eval.benchmarks: empty; nothing to evaluate")


@dataclass(frozen=True)
class EvalRequest:
    """What one :func:`evaluate` call evaluates, and where; a field left None takes its config key."""

    model: str | None = None
    """folder, alias, hub id or model URI (default ``model.name``)"""
    limit: int | None = None
    """items per benchmark (default ``eval.limit``)"""
    baselines: Sequence[str] | None = None
    """baselines beside the model (default ``eval.baselines``; ignored with injected systems)"""
    out_dir: Path | None = None
    """output folder (default ``eval.out_dir``)"""
    data_dir: Path | None = None
    """prepared data (default ``data.out_dir``)"""
    split: str = EVAL_SPLIT
    """TEST, another split (the search's aqua/dev), or ``devset``: the dev items (components/data/devset.py)"""


def evaluate(cfg: Config, request: EvalRequest | None = None, *, tracker: Tracker | None = None,
             systems: Sequence[System] | None = None) -> EvalReport:
    """Evaluate ``request.model`` (default ``cfg.model.name``) and the baselines on ``cfg.eval.benchmarks``.

    ``request.limit`` (default ``eval.limit``) items per benchmark from the TEST split, a seeded sample
    (``eval.seed``); ``request.split`` selects another split or ``devset`` (:func:`.setting.sample_split`).
    ``systems`` injects prebuilt systems (an in-memory policy, fixed-length engines in benchmarks) instead
    of loading models; ``baselines`` is then ignored.
    ``tracker`` (a :class:`components.tracking.Tracker` inside its ``with``) gets the main system's
    ``eval/<benchmark>/*`` metrics, one nested run per other system with the same names, and the
    outputs as artifacts. Writes to ``out_dir`` (default ``eval.out_dir``); see report.py for files,
    published as one set (publish.py): a failed evaluation leaves the previous ones as they were.
    """
    t_start = time.perf_counter()
    req = request or EvalRequest()
    model, split = req.model, req.split
    ev = cfg.eval
    limit = ev.limit if req.limit is None and split != DEVSET else req.limit  # devset: a cap (sample_split)
    baselines = list(ev.baselines if req.baselines is None else req.baselines)
    benchmarks = list(ev.benchmarks)
    _check_names(benchmarks, baselines if systems is None else [])
    data_dir = Path(req.data_dir if req.data_dir is not None else cfg.data.out_dir)
    out_dir = Path(req.out_dir if req.out_dir is not None else ev.out_dir)
    check_out_dir(out_dir)  # before hours of rollouts; also cleans what a killed evaluation left there

    items, devset = sample_split(cfg, data_dir, benchmarks, split, limit)
    meta: dict[str, Any] = {
        "data_dir": str(data_dir), "data_manifest_sha256": manifest_sha256(data_dir),
        "config_hash": cfg.hash(), "seed": ev.seed, "limit": limit, "batch_size": ev.batch_size,
        "self_consistency_k": ev.self_consistency_k, "split": split, "base_model": cfg.model.name,
        "item_ids": {b: [i.id for i in its] for b, its in items.items()},
        "machine": machine_fingerprint(),  # greedy bf16 decodes differ across CPUs: components/machine.py
    }
    if devset is not None:  # each benchmark's dev source, pool and id hash; the test sample it excludes
        meta["devset"] = {"test_limit": ev.limit, "benchmarks": devset}
    if systems is None:
        device = default_device()
        uri, source = resolve_model(cfg, model)
        policy = _load(source, cfg, device)
        base = None
        if set(BASE_WEIGHTS) & set(baselines) and uri != cfg.model.name:  # a trained model: load the base too
            base = _load(resolve_model(cfg, None)[1], cfg, device)
        systems = build_systems(cfg, policy, baselines, base=base, device=device, data_dir=data_dir)
        meta.update(model=uri, model_uri=uri, model_path=str(source), device=device)
    else:
        meta.update(model=model or "injected systems", model_uri=model, device="injected")
    systems = list(systems)
    names = [s.name for s in systems]
    if not systems or len(set(names)) != len(names):
        raise EvalInputError(f"evaluate: systems must be a non-empty list with unique names, got {names}")
    meta["systems"] = [s.name for s in systems]
    meta["decoding"] = ", ".join(f"{s.name}={'greedy' if s.greedy else 'sampled'}" for s in systems)

    main = MAIN_SYSTEM if MAIN_SYSTEM in names else names[0]
    timings: dict[str, float] = {name: 0.0 for name in names}
    timings["grading"] = 0.0
    rows: list[EvalRow] = []
    per_system = {s.name: _run_benchmarks(s, items, batch_size=ev.batch_size, seed=ev.seed, timings=timings)
                  for s in systems}
    t0 = time.perf_counter()
    log.info("evaluate: grading %d episodes", sum(len(e) for eps in per_system.values() for e in eps.values()))
    by_id = {b: {i.id: i for i in its} for b, its in items.items()}  # ids need only be unique per benchmark
    pairs = [(by_id[b][e.question_id], e) for eps in per_system.values() for b, bench_eps in eps.items()
             for e in bench_eps]  # every episode at once: the most parallel sandboxes and workers
    grade_episodes([p[0] for p in pairs], [p[1] for p in pairs], timeout_s=ev.code_timeout_s)
    timings["grading"] += time.perf_counter() - t0
    caps = {s.name: getattr(getattr(s.engine, "cfg", None), "max_message_tokens", cfg.mas.max_message_tokens)
            for s in systems}
    for b in benchmarks:
        rows += [aggregate(b, name, per_system[name][b], cap=caps[name]) for name in names]
        log.info("eval %s: %s", b, ", ".join(f"{r.system}={r.accuracy:.3f}" for r in rows[-len(names):]))
    rows.sort(key=lambda r: (names.index(r.system), benchmarks.index(r.benchmark)))

    grids, more = {}, {}  # the main system's (whatever it is) and every multi-agent system's
    for s in systems:
        if s.name == main or s.name in MAS_SYSTEMS:
            shape = getattr(s.engine, "cfg", cfg.mas)
            grids[s.name] = silence_grid(s.name, [e for b in benchmarks for e in per_system[s.name][b]],
                                         shape.agents, shape.rounds)
        if s.name in MAS_SYSTEMS:
            more[s.name] = silence_details(per_system[s.name], by_id, s.name, shape.agents, shape.rounds,
                                           getattr(shape, "turn_order", "simultaneous"))
    grid = grids[main]
    summary = summarise(rows)
    meta["main_system"] = main
    items_bytes = encode(records_of(per_system, items))  # the per-item record (items.py), hashed as written
    meta["items_sha256"] = items_sha256(items_bytes)
    markdown = render_markdown(rows, summary, meta)
    outputs = EvalOutputs(rows, summary, meta, markdown, grid, items_bytes)
    paths = publish(out_dir, lambda staging: write_outputs(staging, outputs))
    timings["total"] = time.perf_counter() - t_start
    per_item = {name: {b: [ItemOutcome(e.question_id, e.correct, e.total_tokens, e.completion_tokens)
                           for e in per_system[name][b]] for b in benchmarks} for name in names}
    report = EvalReport(rows, markdown, paths, summary, meta, grid, timings, per_item,
                        {name: g for name, g in grids.items() if name in MAS_SYSTEMS}, more)
    if tracker is not None:
        log_to_tracker(tracker, report, main)
    return report


def eval_metrics(rows: Sequence[EvalRow], system: str) -> dict[str, float]:
    """``eval/<benchmark>/{accuracy,tokens_total,tokens_per_correct,silence_rate}`` of one system
    (tokens_per_correct left out where nothing was correct: undefined, and NaN would poison a gate)."""
    out: dict[str, float] = {}
    for r in rows:
        if r.system != system:
            continue
        out[f"eval/{r.benchmark}/accuracy"] = r.accuracy
        out[f"eval/{r.benchmark}/tokens_total"] = float(r.tokens_total)
        out[f"eval/{r.benchmark}/silence_rate"] = r.silence_rate
        if r.tokens_per_correct is not None:
            out[f"eval/{r.benchmark}/tokens_per_correct"] = r.tokens_per_correct
    return out


def summary_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """``eval/<key>`` of one system's :func:`summarise` entry (None values, e.g. no correct answer, left out)."""
    return {f"eval/{k}": float(v) for k, v in summary.items() if v is not None}


def log_to_tracker(tracker: Tracker, report: EvalReport, main: str, model_id: str | None = None) -> None:
    """Main system's metrics on the tracker's run (its summary linked to ``model_id``, a registered
    version's logged model, when given); each other system in a nested run tagged
    ``eval.system=<name>`` with the same contract names (the metric validator allows only those)."""
    meta = report.meta
    tags = {"eval.system": main, "eval.model_uri": meta.get("model_uri"), "eval.config_hash": meta["config_hash"],
            "eval.data_manifest_sha256": meta["data_manifest_sha256"], "eval.seed": meta["seed"],
            "eval.limit": meta["limit"], "eval.machine": describe(meta.get("machine"))}
    tracker.set_tags(tags)
    if meta.get("items_sha256"):  # params are immutable: the gate verifies the items file against this one
        tracker.log_params({ITEMS_PARAM: meta["items_sha256"], MAIN_PARAM: main})
    tracker.log_metrics(eval_metrics(report.table, main))
    tracker.log_metrics(summary_metrics(report.summary[main]), model_id=model_id)
    for name in report.summary:
        if name == main:
            continue
        with tracker.child(f"eval-{name}", tags={**tags, "eval.system": name}) as sub:
            sub.log_metrics(eval_metrics(report.table, name) | summary_metrics(report.summary[name]))
    for path in report.paths.values():
        tracker.log_artifact(path, "eval")
    if "items" in report.paths:
        log_items_table(tracker, report.paths["items"])

