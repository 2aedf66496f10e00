"""Typed schema of ``params.yaml`` and its profiles.

One config for the CLI, the Prefect flows and the DVC stages. ``params.yaml`` holds every
section with its defaults; ``profiles.<name>`` holds partial overrides deep-merged on top.
Every model forbids unknown keys, so a typo is an error that names the key path, never a
silently ignored setting. Load with :func:`load_config`; errors raise :class:`ConfigError`
(the CLI turns it into exit code 2).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from components.errors import UserError
from components.redact import redact_value
from components.yaml_strict import FileTooLarge, read_capped_text, strict_load

BENCHMARKS = ("mmlu", "gsm8k", "multiarith", "svamp", "aqua", "math500", "humaneval")
"""the seven benchmarks of the paper (the default evaluation)"""
ALL_BENCHMARKS = (*BENCHMARKS, "splitinfo")
"""plus the generated split-information task (components/data/splitinfo.py), where silence is provable"""
DEFAULT_PARAMS = Path("params.yaml")


class ConfigError(UserError):
    """A params file or override that does not match the schema."""


class _Section(BaseModel):
    # inf is refused like NaN: no size, rate or limit of this schema means "unbounded" by infinity.
    # strict: no coercion between types. Lax mode read `agents: true` as 1, `steps: '3'` and
    # `steps: 30.5`-like slips as numbers; an int is still accepted where a float is expected.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False, strict=True)


BenchmarkName = Literal["mmlu", "gsm8k", "multiarith", "svamp", "aqua", "math500", "humaneval", "splitinfo"]
BaselineName = Literal["single_cot", "self_consistency", "mas_untrained", "mas_prior"]
BASELINE_NAMES: tuple[str, ...] = get_args(BaselineName)
Name = Annotated[str, Field(min_length=1, pattern=r"\S")]
"""a name, path or URI: an empty or blank one would silently mean the current folder or nothing"""
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]
"""what numpy, torch and Python's random all accept (and derived seeds stay in int64)"""
TRAIN_SOURCE_RE = re.compile(r"^(?P<bench>[a-z0-9]+)/(?P<split>[A-Za-z0-9_.-]+)$")


class DataConfig(_Section):
    benchmarks: list[BenchmarkName] = Field(
        default_factory=lambda: list(ALL_BENCHMARKS), min_length=1, description="benchmarks to prepare and validate")
    mirror: Name | None = Field("../shared/benchmarks", description="offline mirror folder (first source)")
    use_hub: bool = Field(True, description="fall back to the Hugging Face hub when the mirror lacks a file")
    out_dir: Name = Field("data", description="folder for prepared parquet files and manifest.json")
    report_dir: Name = Field("reports", description="folder for validation reports")
    train_sources: list[str] = Field(default_factory=lambda: ["gsm8k/train"], min_length=1,
                                     description="benchmark/split pairs used as training questions (never "
                                                 "the items the evaluation samples)")
    train_mix: Literal["pooled", "balanced"] = Field(
        "pooled", description="pooled: one shuffle over all training questions; balanced: an equal share of "
                              "questions per benchmark, in turn")

    @field_validator("train_sources")
    @classmethod
    def _sources_are_benchmark_splits(cls, value: list[str]) -> list[str]:
        for source in value:
            m = TRAIN_SOURCE_RE.match(source)
            if m is None or m["bench"] not in ALL_BENCHMARKS:
                raise ValueError(f"{source!r} must be 'benchmark/split' with benchmark one of "
                                 f"{', '.join(ALL_BENCHMARKS)} (e.g. gsm8k/train)")
        return value


class ModelConfig(_Section):
    name: Name = Field("smollm2-135m-instruct",
                      description="alias (smollm2-135m-instruct, tiny-random), HF hub id or local folder")
    cache_dir: Name = Field("~/.cache/agent-gspo/models", description="where converted models are cached")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="weights dtype; auto = bf16 on a bf16-capable GPU, else fp32; "
                            "float16 is for evaluation only (training refuses it: no loss scaling)")
    lora_rank: int = Field(0, ge=0, description="LoRA rank (0 = full fine-tuning)")
    lora_alpha: int = Field(16, ge=1, description="LoRA alpha")
    gradient_checkpointing: bool = Field(False, description="trade compute for activation memory")
    silence_prior: float = Field(0.0, ge=0.0, lt=1.0,
                                 description="initial P(silence) as a reply's first token (0 = the untrained row)")
    silence_calibration: Literal["mean_direction", "per_prompt"] = Field(
        "mean_direction", description="how the silence row is fit: mean_direction = one direction, its mean logit "
                                      "on target (every committed run); per_prompt = a ridge fit giving every "
                                      "calibration prompt the prior (evener, but the proof recipe collapsed with it)")


class MasConfig(_Section):
    agents: int = Field(3, ge=1, le=16, description="number of agents sharing one policy")
    rounds: int = Field(2, ge=1, le=8, description="communication rounds T")
    topology: Literal["complete", "chain", "star", "layered", "debate", "custom"] = Field(
        "complete", description="who hears whom")
    adjacency: list[list[int]] | None = Field(None, description="custom adjacency matrix [sender][receiver]")
    aggregation: Literal["majority", "decision_agent"] = Field("majority", description="how the final answer is chosen")
    protocol: Literal["adaptive", "broadcast"] = Field(
        "adaptive",
        description="adaptive: silence retires an agent, nothing new = no call; broadcast: every agent every round")
    turn_order: Literal["simultaneous", "in_turn"] = Field(
        "simultaneous", description="cyclic topologies: one batched call per round, or agents one after another")
    max_message_tokens: int = Field(128, ge=1, le=32768, description="hard cap on tokens per message")
    context_tokens: int = Field(1024, ge=64, le=1_048_576, description="budget of earlier messages kept in a prompt")
    silence_marker: Name = Field("<silent>",
                                description="the silence token (added to the tokenizer as one special token)")
    temperature: float = Field(0.8, ge=0.0, le=2.0, description="sampling temperature")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling")
    static_cache: bool = Field(False, description="static KV cache (+ torch.compile on CUDA) for decoding")
    must_answer: bool = Field(
        False, description="agent 0 may not be silent in round 0, so a team always answers (adaptive protocol: an "
                           "all-silent first round ends the episode with no answer)")

    @model_validator(mode="after")
    def _custom_needs_matrix(self) -> MasConfig:
        n = self.agents
        if self.must_answer and n < 2:
            raise ValueError("mas.must_answer needs a team (mas.agents >= 2): a lone agent is never silent")
        if self.topology == "custom":
            if self.adjacency is None or len(self.adjacency) != n or any(len(r) != n for r in self.adjacency):
                raise ValueError(f"topology 'custom' needs mas.adjacency as a {n}x{n} matrix of 0/1")
        elif self.adjacency is not None:
            raise ValueError(f"mas.adjacency is read only with topology 'custom' (topology is {self.topology!r}): "
                             "set mas.topology=custom or mas.adjacency=null")
        bad = sorted({v for row in self.adjacency or [] for v in row} - {0, 1})
        if bad:
            raise ValueError(f"mas.adjacency must hold only 0 and 1 (found {bad})")
        return self


class RewardConfig(_Section):
    lambda_tok: float = Field(0.1, ge=0.0, description="initial token penalty (steered by the budget controller)")
    lambda_turn: float = Field(0.01, ge=0.0, description="penalty per non-silent message")
    lambda_rep: float = Field(0.1, ge=0.0, description="penalty for n-gram repetition (0..1)")
    token_measure: Literal["completion", "communicated", "total"] = Field(
        "completion", description="which token count the penalty and budget refer to")
    token_norm: float = Field(256.0, gt=0.0, description="B_norm: tokens are divided by this in the reward")
    repetition_ngram: int = Field(3, ge=1, description="n for the repetition n-gram overlap")
    per_agent_credit: bool = Field(False, description="charge each message its own cost (shaped credit)")


class BudgetConfig(_Section):
    enabled: bool = Field(True, description="steer lambda_tok with dual ascent")
    target: float = Field(400.0, gt=0.0, description="B: target mean tokens per episode (token_measure)")
    fraction: float | None = Field(None, gt=0.0, le=10.0,
                                   description="B = this x the untrained policy's sampled tokens per training episode, "
                                               "measured before step 1 (null: use target)")
    calibration_questions: int = Field(8, ge=1, description="training questions (x G episodes) that measure it")
    lr: float = Field(0.05, gt=0.0, description="eta: dual ascent step size (integral gain)")
    kp: float = Field(0.0, ge=0.0, description="proportional gain on the budget error (0 = plain dual ascent)")
    mode: Literal["cap", "target"] = Field(
        "cap", description="cap: spend at most B (lambda_tok in [lambda_min, lambda_max]); target: spend B (an "
                           "equality constraint, lambda_tok in [-lambda_max, lambda_max]: below B tokens earn a bonus)")
    lambda_min: float = Field(0.0, ge=0.0, description="lower bound of lambda_tok (cap mode)")
    lambda_max: float = Field(10.0, gt=0.0, description="upper bound of |lambda_tok|")

    @model_validator(mode="after")
    def _target_has_no_lambda_min(self) -> BudgetConfig:
        if self.mode == "target" and self.lambda_min != 0.0:
            raise ValueError(f"budget.lambda_min={self.lambda_min!r} applies to mode 'cap' only; mode 'target' "
                             f"bounds lambda_tok by [-lambda_max, lambda_max] (remove budget.lambda_min)")
        if self.lambda_min > self.lambda_max:
            raise ValueError(f"budget.lambda_min={self.lambda_min!r} is above budget.lambda_max={self.lambda_max!r}")
        # unlike lr, mode or lambda_max (a profile's budget left in place when an experiment turns it
        # off), fraction is null in every profile: set with the budget off, it is a mistake
        if self.fraction is not None and not self.enabled:
            raise ValueError(f"budget.fraction={self.fraction!r} is read only with budget.enabled=true (with the "
                             "budget off no B is calibrated or tracked): set budget.enabled=true or "
                             "budget.fraction=null")
        return self


class GspoConfig(_Section):
    steps: int = Field(200, ge=1, description="training steps (rollout batches)")
    questions_per_step: int = Field(8, ge=1, le=1024, description="questions per rollout batch")
    group_size: int = Field(8, ge=2, le=256, description="G: episodes sampled per question")
    minibatches: int = Field(4, ge=1, description="mu: optimizer updates per rollout batch")
    eps_low: float = Field(3e-4, ge=0.0, description="lower clip range of the sequence ratio")
    eps_high: float = Field(4e-4, ge=0.0, description="upper clip range of the sequence ratio")
    level: Literal["sequence", "sequence_token", "token"] = Field(
        "sequence", description="GSPO, GSPO-token, or GRPO-style token ratios (ablation)")
    kl_beta: float = Field(0.0, ge=0.0, description="KL penalty to the reference policy")
    log_kl_base: bool = Field(True, description="log KL(pi_old || base) on 16 messages a step (full FT keeps a "
                                                "frozen base copy; off under ZeRO-3 without LoRA)")
    adv_norm: Literal["group", "batch", "none"] = Field("group", description="advantage normalisation")
    group_by_agent_round: bool = Field(False, description="normalise per (question, agent, round)")
    adv_std_floor: float = Field(1e-6, gt=0.0, description="floor on the group std")
    lr: float = Field(1e-6, gt=0.0, description="learning rate")
    warmup_steps: int = Field(0, ge=0, description="linear warm-up, in optimizer updates (minibatches per step)")
    lr_schedule: Literal["constant", "cosine", "linear"] = Field("constant", description="schedule after warm-up")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay")
    grad_clip: float = Field(1.0, gt=0.0, description="max gradient norm")
    grad_accum: int = Field(1, ge=1, description="gradient accumulation steps per mini-batch")
    engine: Literal["deepspeed", "torch"] = Field("deepspeed", description="training engine")
    checkpoint_every: int = Field(25, ge=1, description="checkpoint every N steps")
    keep_checkpoints: int = Field(3, ge=1, description="keep the last K checkpoints")
    out_dir: Name = Field("runs/train", description="checkpoints and final policy")
    seed: Seed = Field(0, description="global seed")


class DeepSpeedConfig(_Section):
    zero_stage: Literal[0, 1, 2, 3] = Field(2, description="ZeRO stage")
    launcher: Literal["none", "deepspeed", "torchrun"] = Field("none", description="how the flow launches training")
    num_nodes: int = Field(1, ge=1, description="nodes")
    nproc_per_node: int = Field(1, ge=1, description="processes (GPUs) per node")
    hostfile: str | None = Field(None, description="DeepSpeed hostfile for multi-node runs")
    master_port: int = Field(29500, ge=1024, le=65535, description="rendezvous port")

    @model_validator(mode="after")
    def _hostfile_needs_its_launcher(self) -> DeepSpeedConfig:
        # only the DeepSpeed launcher reads a hostfile: with torchrun or none it would be silently ignored
        if self.hostfile is not None and self.launcher != "deepspeed":
            raise ValueError(f"deepspeed.hostfile is read only with deepspeed.launcher=deepspeed (launcher is "
                             f"{self.launcher!r}): set deepspeed.launcher=deepspeed or deepspeed.hostfile=null")
        # launcher none is one process: no other rank or node would ever start (a torchrun started by
        # hand takes its world size from its own options, never from these keys)
        extra = [f"deepspeed.{k}={v}" for k, v in (("nproc_per_node", self.nproc_per_node),
                                                    ("num_nodes", self.num_nodes)) if v > 1]
        if extra and self.launcher == "none":
            reset = " and ".join(f"{e.split('=')[0]}=1" for e in extra)
            raise ValueError(f"{' and '.join(extra)} {'is' if len(extra) == 1 else 'are'} read only with a launcher "
                             "(deepspeed.launcher is 'none': one process, the others would never start): set "
                             f"deepspeed.launcher=torchrun or deepspeed.launcher=deepspeed, or {reset}")
        return self


class SearchConfig(_Section):
    enabled: bool = Field(False, description="run the search stage in the pipeline")
    trials: int = Field(20, ge=1, description="max trials")
    budget_tokens: int = Field(0, ge=0, description="stop after this many rollout tokens (0 = no limit)")
    budget_seconds: float = Field(0.0, ge=0.0, description="stop after this wall-clock (0 = no limit)")
    max_tokens_per_episode: float = Field(400.0, gt=0.0, description="constraint on mean tokens per episode")
    storage: Name = Field("sqlite:///optuna.db", description="Optuna storage URL")
    study_name: Name = Field("agent-gspo", description="Optuna study name")
    trial_steps: int = Field(5, ge=1, description="training steps per trial")
    dev_items: int = Field(20, ge=1, description="held-out dev items per trial")
    out_params: Name = Field("search/best_params.yaml", description="best parameters file read by train")


class EvalConfig(_Section):
    limit: int | None = Field(None, ge=1, description="items per benchmark (seeded sample); null = all")
    benchmarks: list[BenchmarkName] = Field(default_factory=lambda: list(BENCHMARKS), min_length=1,
                                            description="benchmarks to evaluate")
    baselines: list[BaselineName] = Field(
        default_factory=lambda: ["single_cot", "self_consistency", "mas_untrained"], description="baselines")
    self_consistency_k: int = Field(5, ge=1, description="samples for self-consistency")
    batch_size: int = Field(16, ge=1, description="questions per rollout batch")
    seed: Seed = Field(1234, description="seed of the item sample and sampling")
    out_dir: Name = Field("eval", description="evaluation outputs")
    code_timeout_s: float = Field(10.0, gt=0.0, description="wall-clock limit per HumanEval program")


class RegistryConfig(_Section):
    model_name: Name = Field("agent-gspo-policy", description="registered model name")
    accuracy_tolerance: float = Field(0.01, ge=0.0, le=1.0, description="allowed accuracy drop vs champion")
    max_token_ratio: float = Field(1.0, gt=0.0, description="candidate tokens may be at most this x champion's")
    min_accuracy: float = Field(0.0, ge=0.0, le=1.0, description="absolute bar for the first champion")


class TrackingConfig(_Section):
    uri: Name = Field("sqlite:///mlflow.db", description="MLflow tracking URI")
    experiment: Name = Field("agent-gspo", description="MLflow experiment")
    log_model: bool = Field(True, description="log and register the final policy")
    outage_wait_s: float = Field(900.0, ge=0.0, description="at the end of training, how long to wait for an "
                                 "unreachable tracking server (metrics are buffered meanwhile)")


EXPERIMENT_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
EXPERIMENT_FROZEN_SECTIONS = ("eval", "experiments", "profile")
"""sections an experiment may not override: every experiment is evaluated on the SAME seeded
sample (``eval.*``), and an experiment cannot redefine the experiments themselves"""


class ExperimentDef(_Section):
    """One reproduction experiment: ``section.key=value`` overrides on top of the selected profile."""

    kind: Literal["baselines", "gspo", "proof"] = Field(
        "gspo", description="baselines: evaluate eval.baselines only; gspo: train, then evaluate the policy alone; "
                            "proof: untrained, prior-only, budgeted and λ=0 systems under its own profile")
    profile: str | None = Field(None, description="proof kind: the profile it runs under (its own task and settings)")
    label: str = Field("", description="row name in the report (default: the experiment name)")
    description: str = Field("", description="one sentence: what the experiment shows")
    extends: str | None = Field(None, description="inherit another experiment's overrides and budget_fraction")
    overrides: list[str] = Field(default_factory=list, description="section.key=value, applied on the profile")
    budget_fraction: float | None = Field(
        None, gt=0.0, le=10.0, description="budget.fraction: B = this x the untrained policy's tokens per sampled "
                                           "training episode, measured before step 1")

    @model_validator(mode="after")
    def _check(self) -> ExperimentDef:
        for text in self.overrides:
            try:
                keys, _ = parse_override(text)
            except ConfigError as exc:  # a ValueError, so pydantic reports it under its key path
                raise ValueError(str(exc)) from None
            if keys[0] in EXPERIMENT_FROZEN_SECTIONS:
                raise ValueError(f"override {text!r}: {keys[0]}.* may not vary per experiment (every experiment "
                                 "is evaluated on the same seeded sample; use the profile or --set instead)")
            if len(keys) != 2 or keys[0] not in Config.model_fields:
                allowed = ", ".join(k for k in Config.model_fields if k not in EXPERIMENT_FROZEN_SECTIONS)
                raise ValueError(f"override {text!r}: expected section.key=value with section one of {allowed}")
            section = Config.model_fields[keys[0]].annotation
            if keys[1] not in section.model_fields:  # type: ignore[union-attr]
                raise ValueError(f"override {text!r}: unknown key {keys[1]!r} in section {keys[0]} "
                                 f"(allowed: {', '.join(section.model_fields)})")  # type: ignore[union-attr]
        budget_keys = (["budget", "target"], ["budget", "fraction"])
        if self.budget_fraction is not None and any(parse_override(t)[0] in budget_keys for t in self.overrides):
            raise ValueError("budget_fraction sets B (budget.fraction); do not also override budget.target or "
                             "budget.fraction")
        if (self.kind == "proof") != (self.profile is not None):
            raise ValueError("kind 'proof' needs a profile (its own task and settings), and only it takes one")
        if self.kind == "baselines" and (self.budget_fraction is not None or self.overrides or self.extends):
            raise ValueError("kind 'baselines' takes no overrides, extends or budget_fraction (it evaluates the "
                             "configured base model; overriding it would change what 'untrained' means)")
        return self


class ExperimentsConfig(_Section):
    profile: str = Field("results", description="profile `experiments run` uses when --profile is not given")
    results_dir: Name = Field("results", description="one <name>.json per experiment (committed)")
    runs_dir: Name = Field("runs/experiments", description="per-experiment training and evaluation folders")
    report: Name = Field("docs/results.md", description="generated report; PNGs go to <report dir>/<stem>/")
    last_k: int = Field(5, ge=1, description="last training steps averaged when checking tokens against B")
    definitions: dict[str, ExperimentDef] = Field(default_factory=dict, description="name -> experiment")

    @model_validator(mode="after")
    def _check(self) -> ExperimentsConfig:
        defs = self.definitions
        for name, d in defs.items():
            if not EXPERIMENT_NAME_RE.match(name):
                raise ValueError(f"definitions.{name}: names must match {EXPERIMENT_NAME_RE.pattern} "
                                 "(they become file names)")
            seen = [name]
            while d.extends is not None:
                if d.extends not in defs:
                    raise ValueError(f"definitions.{seen[-1]}.extends: unknown experiment {d.extends!r} "
                                     f"(defined: {', '.join(defs)})")
                if d.extends in seen:
                    raise ValueError(f"definitions.{name}.extends: cycle {' -> '.join([*seen, d.extends])}")
                seen.append(d.extends)
                d = defs[d.extends]
        return self


class Config(_Section):
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    mas: MasConfig = Field(default_factory=MasConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    gspo: GspoConfig = Field(default_factory=GspoConfig)
    deepspeed: DeepSpeedConfig = Field(default_factory=DeepSpeedConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    registry: RegistryConfig = Field(default_factory=RegistryConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    experiments: ExperimentsConfig = Field(default_factory=ExperimentsConfig)
    profile: str = Field("default", description="name of the applied profile")

    @model_validator(mode="after")
    def _reference_model_fits_zero3(self) -> Config:
        # The KL reference is a frozen copy of the initial policy unless LoRA adapters can simply be
        # switched off; a copy of a ZeRO-3-partitioned module holds no weights of its own.
        g = self.gspo
        if g.kl_beta > 0 and g.engine == "deepspeed" and self.deepspeed.zero_stage == 3 and self.model.lora_rank == 0:
            raise ValueError(f"gspo.kl_beta={g.kl_beta} with gspo.engine=deepspeed and deepspeed.zero_stage=3 needs "
                             "model.lora_rank > 0 (the reference policy is then the base model with adapters off); "
                             "a full-weight reference copy of a ZeRO-3-partitioned model is not supported: use "
                             "deepspeed.zero_stage <= 2, LoRA, or gspo.kl_beta=0")
        return self

    @model_validator(mode="after")
    def _every_rank_gets_questions(self) -> Config:
        ds = self.deepspeed
        if ds.launcher != "none":
            world = ds.nproc_per_node * ds.num_nodes
            problem = rank_split_problem(self, world)
            if problem:
                raise ValueError(f"{problem}; the world size here is deepspeed.nproc_per_node={ds.nproc_per_node} "
                                 f"x deepspeed.num_nodes={ds.num_nodes}")
        return self

    def hash(self) -> str:
        """sha256 of the canonical JSON of this config (the 'config hash' in tags and checkpoints).

        The ``experiments`` section is left out: it lists runs to make, not a setting of any one run,
        so editing an experiment must not change (and block resuming) every other run's hash. So is
        ``tracking``: where results are logged does not change them, and a run must resume after
        ``MLFLOW_TRACKING_URI`` moved (or its password changed)."""
        blob = json.dumps(self.model_dump(mode="json", exclude={"experiments", "tracking"}), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()

    def flat(self) -> dict[str, Any]:
        """Flattened ``section.key`` mapping, for MLflow params (``experiments`` left out, as in :meth:`hash`);
        URI passwords in values are replaced by ``***`` (these values are logged and stored)."""
        out: dict[str, Any] = {}
        for section, values in self.model_dump(mode="json", exclude={"experiments"}).items():
            if isinstance(values, dict):
                out.update({f"{section}.{k}": redact_value(v) for k, v in values.items()})
            else:
                out[section] = redact_value(values)
        return out


def rank_split_problem(cfg: Config, world_size: int) -> str | None:
    """Why ``world_size`` ranks cannot share this config's steps (None: they can). Each rank plays
    ``questions_per_step / world_size`` questions (a whole number, at least one) and splits its
    messages into ``minibatches x grad_accum`` micro-batches; every rank must make the same number
    of passes (gradient all-reduce per update, ZeRO-3 gathers in every forward), so each needs that
    many messages. Round 0 alone gives ``questions x group_size x agents`` of them on every rank."""
    g = cfg.gspo
    if world_size <= 1:
        return None
    if g.questions_per_step % world_size:
        return (f"gspo.questions_per_step={g.questions_per_step} must be a multiple of the world size {world_size}: "
                f"every rank plays questions_per_step / world_size questions (e.g. gspo.questions_per_step="
                f"{world_size * -(-g.questions_per_step // world_size)})")
    per_rank = g.questions_per_step // world_size * g.group_size * cfg.mas.agents
    if per_rank < g.minibatches * g.grad_accum:
        return (f"every rank splits its round-0 messages (gspo.questions_per_step / world size x gspo.group_size x "
                f"mas.agents = {per_rank}) into gspo.minibatches x gspo.grad_accum = {g.minibatches * g.grad_accum} "
                "micro-batches, so that all ranks make the same passes: raise gspo.questions_per_step or lower "
                "gspo.minibatches / gspo.grad_accum")
    return None


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Return ``base`` with ``override`` merged in recursively (override wins)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


MAX_KEY_PATH = 8
"""longest ``--set`` key path accepted (the deepest setting, experiments.definitions.NAME.key, has 4)"""


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``section.key=value`` (value as YAML) into a key path and a value."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected section.key=value")
    key, raw = text.split("=", 1)
    keys = key.strip().split(".")
    if len(keys) > MAX_KEY_PATH:
        raise ConfigError(f"override {text[:80]!r}...: a key path of {len(keys)} names (settings are at most "
                          f"{MAX_KEY_PATH} deep)")
    if not all(k.strip() for k in keys):
        raise ConfigError(f"override {text!r}: empty name in the key path {key.strip()!r} (expected section.key=value)")
    if keys[0] in ("profile", "profiles"):
        raise ConfigError(f"override {text!r}: {keys[0]} is not a setting; choose a profile with --profile NAME "
                          "(or $AGENT_GSPO_PROFILE), and edit profiles in the params file")
    try:
        value = strict_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({_one_line(exc)})") from exc
    return keys, value


def set_override(raw: dict[str, Any], text: str) -> None:
    """Apply one ``section.key=value`` override to a raw (unvalidated) config mapping in place."""
    keys, value = parse_override(text)
    node = raw
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {text!r}: {k} is not a section")
    node[keys[-1]] = value


YAML11_BOOLEANS = frozenset({"yes", "no", "on", "off", "y", "n"})
"""YAML 1.1 spellings of booleans, strings here (:mod:`components.yaml_strict`): named in the error"""


def format_errors(exc: ValidationError, source: str) -> str:
    """A pydantic error as ``source: invalid configuration`` plus one line per key path."""
    lines = [f"{source}: invalid configuration"]
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "<root>"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
            section = Config.model_fields.get(str(err["loc"][0])) if err["loc"] else None
            if section is not None and len(err["loc"]) == 2 and hasattr(section.annotation, "model_fields"):
                msg += f" (allowed: {', '.join(section.annotation.model_fields)})"
            elif len(err["loc"]) == 1:
                msg += f" (allowed sections: {', '.join(k for k in Config.model_fields if k != 'profile')})"
        elif err["type"] == "bool_type" and str(err.get("input")).lower() in YAML11_BOOLEANS:
            msg += " (booleans are true or false, as in YAML 1.2)"
        shown = repr(err.get("input"))
        # at the root, or under a model-level validator, the input is a whole section: the message names the keys
        got = f" (got {shown if len(shown) <= 120 else shown[:117] + '...'})" if err["loc"] and not isinstance(
            err.get("input"), dict) else ""
        lines.append(f"  {path}: {msg}{got}")
    return "\n".join(lines)


def _one_line(exc: yaml.YAMLError) -> str:
    """PyYAML's multi-line message (problem, context, a caret under the line) as one line."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark is not None else problem


def read_params_file(path: Path) -> dict[str, Any]:
    """The mapping in a params file; :class:`ConfigError` naming the file for anything else
    (unreadable, not UTF-8, not YAML, a repeated key, an alias, not a mapping)."""
    try:
        text = read_capped_text(path)
    except FileTooLarge as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte offset {exc.start})") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the params file: {exc.strerror or exc}") from exc
    try:
        loaded = strict_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {_one_line(exc)}") from exc
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections")
    return loaded or {}


def load_config(path: str | os.PathLike[str] | None = None, profile: str | None = None,
                overrides: list[str] | None = None) -> Config:
    """Read ``params.yaml``, apply ``profiles[profile]``, ``$MLFLOW_TRACKING_URI``, then ``overrides``.

    ``profile`` defaults to ``$AGENT_GSPO_PROFILE`` or ``default``. Without ``path`` and
    ``$AGENT_GSPO_PARAMS`` a missing ``params.yaml`` gives the schema defaults; a params file that
    was named and is missing is an error. Raises :class:`ConfigError` naming the file, key path and
    allowed values.
    """
    named = path is not None or bool(os.environ.get("AGENT_GSPO_PARAMS"))
    path = Path(path) if path is not None else Path(os.environ.get("AGENT_GSPO_PARAMS") or DEFAULT_PARAMS)
    if profile is not None and not profile.strip():
        raise ConfigError("--profile: empty profile name (omit it for the default)")
    profile = profile or os.environ.get("AGENT_GSPO_PROFILE") or "default"
    raw: dict[str, Any] = {}
    if path.exists() or path.is_symlink():
        raw = read_params_file(path)
    elif named:
        raise ConfigError(f"{path}: params file not found")
    if "profile" in raw:
        raise ConfigError(f"{path}: 'profile' is not a section; choose a profile with --profile NAME "
                          "(or $AGENT_GSPO_PROFILE)")
    profiles = raw.pop("profiles", {}) or {}
    if not isinstance(profiles, dict):
        raise ConfigError(f"{path}: profiles must be a mapping of name -> overrides")
    if profile != "default" or profile in profiles:
        if profile not in profiles and profile != "default":
            names = ", ".join(dict.fromkeys(["default", *map(str, profiles)]))
            raise ConfigError(f"{path}: unknown profile {profile!r} (allowed: {names})")
        chosen = profiles.get(profile) or {}
        if not isinstance(chosen, dict):
            raise ConfigError(f"{path}: profiles.{profile} must be a mapping of sections (got {chosen!r})")
        raw = deep_merge(raw, chosen)
    # environment the tools themselves honour: MLFLOW_TRACKING_URI beats the file, --set beats both
    if os.environ.get("MLFLOW_TRACKING_URI"):
        raw.setdefault("tracking", {})
        if isinstance(raw["tracking"], dict):
            raw["tracking"]["uri"] = os.environ["MLFLOW_TRACKING_URI"]
    for text in overrides or []:
        set_override(raw, text)
    raw["profile"] = profile
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, f"{path} (profile {profile})")) from exc
