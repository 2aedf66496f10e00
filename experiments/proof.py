"""The ``silence_proof`` experiment: strategic silence on the real model, on the split-information task.

One run (``agent-gspo experiments run --only silence_proof``) under its own profile trains and
evaluates four systems on the same held-out items (``splitinfo/test``, disjoint from training):

* ``mas_untrained`` — the base model under the adaptive protocol, silence token untrained;
* ``mas_prior`` — the same with the silence prior and no RL (the training runs' step-0 policy);
* ``agent_gspo`` — Agent-GSPO with the dual budget, B = ``budget_fraction`` x the untrained
  policy's sampled completion tokens per training episode (measured before step 1);
* ``lambda0`` — the same recipe with no token, turn or repetition penalty and no budget.

The results file holds every system's cells, per-item correctness and tokens (paired
comparisons), and both training histories; :mod:`experiments.proof_report` turns it
into the report's section and verdicts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from components.config import Config, load_config, set_override
from components.evaluation import EvalRequest, build_systems, evaluate
from components.evaluation.setting import item_ids_sha256
from components.models import PolicyInit, load_policy
from components.runtime.training_run import train
from experiments.definitions import Experiment, budget_overrides, read_calibration, settings_of
from experiments.results import (
    EvalCell,
    ResultsFileError,
    StrictRecord,
    file_kind,
    format_validation_error,
    json_files,
    read_json,
)
from experiments.schema import study_section

Log = Callable[[str], None]


@dataclass(frozen=True)
class RunContext:
    """What every experiment of one ``experiments run`` shares: where the prepared data is, whether
    MLflow tracks it, where progress lines go, and the commit of the code (taken when the run started)."""

    data_dir: Path
    track: bool = True
    log: Log = print
    commit: str | None = None


SYSTEMS = ("mas_untrained", "mas_prior", "agent_gspo", "lambda0")
LAMBDA0 = ("reward.lambda_tok=0", "budget.enabled=false", "budget.fraction=null", "reward.lambda_turn=0",
           "reward.lambda_rep=0")
"""the λ=0 variant: task reward only"""


class ProofRun(StrictRecord):
    """One training run of the proof."""

    history: list[dict[str, float]]
    budget_calibration: dict[str, float | str] | None
    """how B was set (untrained sampled mean, fraction, target); None when the budget is off"""
    train_seconds: float = Field(ge=0.0)
    eval_seconds: float = Field(ge=0.0)
    trained_model: str
    mlflow: dict[str, str | None]


class ProofResults(StrictRecord):
    """``results/<name>.json`` of a proof experiment."""

    schema_version: Literal[1]
    name: str
    kind: Literal["proof"]
    label: str
    description: str
    profile: str
    overrides: list[str]
    config_hash: str
    data_manifest_sha256: str | None
    model: str
    git_commit: str | None
    limit: int | None
    benchmarks: list[str]
    item_ids_sha256: str
    settings: dict[str, Any]
    recipe: dict[str, Any]
    """the training settings that matter for the proof (flattened config keys)"""
    wall_seconds: float = Field(ge=0.0)
    eval: dict[str, dict[str, EvalCell]]
    """system -> benchmark -> numbers"""
    correct: dict[str, list[bool]]
    """system -> per item (sample order, benchmarks concatenated): correct"""
    tokens: dict[str, list[int]]
    """system -> per item: total tokens (prompt + completion)"""
    runs: dict[str, ProofRun]
    """agent_gspo and lambda0"""
    machine: dict[str, Any] | None = None
    """what it ran on (components/machine.py: CPU, bf16 flags, cores, threads, versions); None in files
    written before it was recorded"""


RECIPE_KEYS = ("model.silence_prior", "model.lora_rank", "model.dtype", "mas.agents", "mas.rounds", "mas.protocol",
               "mas.max_message_tokens", "mas.temperature", "reward.lambda_tok", "reward.lambda_turn",
               "reward.token_norm", "reward.per_agent_credit", "budget.fraction", "budget.mode", "budget.lr",
               "budget.kp", "budget.lambda_max",
               "gspo.steps", "gspo.questions_per_step", "gspo.group_size", "gspo.minibatches", "gspo.lr",
               "gspo.eps_low", "gspo.eps_high", "gspo.level", "gspo.adv_norm", "gspo.adv_std_floor", "gspo.kl_beta",
               "gspo.lr_schedule", "gspo.lr_min_ratio", "gspo.share_prompts", "gspo.seed",
               "model.silence_calibration", "data.train_sources")


def proof_config(params: str | None, exp: Experiment, profile: str, user_overrides: Sequence[str]) -> Config:
    """The proof's config: its own profile, its overrides, ``--set`` last; B from ``budget_fraction``."""
    cfg = load_config(params, profile, [*exp.overrides, *budget_overrides(exp), *user_overrides])
    run_dir = Path(study_section(cfg).runs_dir) / exp.name
    return cfg.model_copy(update={"gspo": cfg.gspo.model_copy(update={"out_dir": str(run_dir)}),
                                  "eval": cfg.eval.model_copy(update={"out_dir": str(run_dir / "eval")})})


def _variant(cfg: Config, name: str, overrides: Sequence[str] = ()) -> Config:
    raw = cfg.model_dump(mode="json")
    for text in overrides:
        set_override(raw, text)
    raw["gspo"]["out_dir"] = str(Path(cfg.gspo.out_dir) / name)
    raw["eval"]["out_dir"] = str(Path(cfg.gspo.out_dir) / name / "eval")
    return Config.model_validate(raw)


def run_proof(cfg: Config, exp: Experiment, overrides: Sequence[str], ctx: RunContext) -> ProofResults:
    """Train and evaluate the four systems (see the module docstring); returns the unwritten results."""
    data_dir, track, log, commit = ctx.data_dir, ctx.track, ctx.log, ctx.commit
    t0 = time.perf_counter()
    reports: dict[str, Any] = {}
    log(f"[{exp.name}] evaluating mas_untrained and mas_prior of {cfg.model.name} on "
        f"{', '.join(cfg.eval.benchmarks)} ({cfg.eval.limit or 'all'} items)")
    pair = ["mas_untrained", "mas_prior"]
    base_cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"baselines": pair})})
    policy = load_policy(cfg.model.name, PolicyInit(seed=cfg.gspo.seed), cache_dir=cfg.model.cache_dir,
                         dtype=cfg.model.dtype, silence_marker=cfg.mas.silence_marker)
    systems = build_systems(base_cfg, policy, base_cfg.eval.baselines, data_dir=data_dir)[1:]
    reports["baselines"] = evaluate(base_cfg, EvalRequest(model=cfg.model.name, data_dir=data_dir,
                                    out_dir=Path(cfg.eval.out_dir) / "baselines"), systems=systems)
    runs: dict[str, ProofRun] = {}
    for name, variant in (("agent_gspo", _variant(cfg, "agent_gspo")), ("lambda0", _variant(cfg, "lambda0", LAMBDA0))):
        log(f"[{exp.name}] training {name}: {variant.gspo.steps} step(s) into {variant.gspo.out_dir}")
        t1 = time.perf_counter()
        # an experiment (re)run trains from scratch: the folder's earlier checkpoints are its own
        result = train(variant, out_dir=variant.gspo.out_dir, data_dir=data_dir, track=track, overwrite=True)
        t2 = time.perf_counter()
        log(f"[{exp.name}] evaluating {name} ({result.final_model})")
        reports[name] = evaluate(variant, EvalRequest(model=str(result.final_model), baselines=[], data_dir=data_dir,
                                 out_dir=Path(variant.eval.out_dir)))
        calibration = read_calibration(variant.gspo.out_dir)
        runs[name] = ProofRun(history=[{k: float(v) for k, v in h.items()} for h in result.history],
                              budget_calibration=calibration, train_seconds=round(t2 - t1, 1),
                              eval_seconds=round(time.perf_counter() - t2, 1), trained_model=str(result.final_model),
                              mlflow={"train_run_id": result.run_id, "model_version": result.model_version})
    cells: dict[str, dict[str, EvalCell]] = {}
    correct: dict[str, list[bool]] = {}
    tokens: dict[str, list[int]] = {}
    for source, rep in reports.items():
        for row in rep.table:
            system = source if source in runs else row.system
            cells.setdefault(system, {})[row.benchmark] = row.numbers()
        for sys_name, per_bench in rep.per_item.items():
            system = source if source in runs else sys_name
            outcomes = [o for b in cfg.eval.benchmarks for o in per_bench[b]]
            correct[system] = [o.correct for o in outcomes]
            tokens[system] = [o.tokens_total for o in outcomes]
    meta = reports["baselines"].meta
    if any(reports[n].meta["item_ids"] != meta["item_ids"] for n in runs):
        raise ResultsFileError(f"{exp.name}: the trained systems were evaluated on other items than the baselines")
    flat = cfg.flat()
    return ProofResults(
        schema_version=1, name=exp.name, kind="proof", label=exp.label, description=exp.description,
        profile=cfg.profile, overrides=list(overrides), config_hash=cfg.hash(),
        data_manifest_sha256=meta.get("data_manifest_sha256"), model=cfg.model.name, git_commit=commit,
        limit=meta.get("limit"), benchmarks=list(cfg.eval.benchmarks),
        item_ids_sha256=item_ids_sha256(meta["item_ids"]),
        settings=settings_of(cfg), recipe={k: flat.get(k) for k in RECIPE_KEYS},
        wall_seconds=round(time.perf_counter() - t0, 1), eval=cells, correct=correct, tokens=tokens, runs=runs,
        machine=meta.get("machine"))


def load_proofs(folder: str | Path) -> dict[str, Any]:
    """The proof files of ``folder`` (``kind: proof``), validated; errors name the file and key."""
    out = {}
    for path in json_files(folder):
        if file_kind(path) != "proof":
            continue
        try:
            proof = ProofResults.model_validate(read_json(path))
        except ValidationError as exc:
            raise ResultsFileError(format_validation_error(exc, path)) from exc
        if proof.name != path.stem:
            raise ResultsFileError(f"{path}: name {proof.name!r} does not match the file name {path.stem!r}")
        out[path.stem] = proof
    return out
