"""The sections of ``params.yaml`` (``data``, ``model``, ``mas``, ... ``tracking``) as strict pydantic models.

:mod:`components.config` assembles them into :class:`components.config.Config` with the
experiments and profiles, and loads ``params.yaml``; import from there. Split out only to keep
each file readable: the schema is one schema.
"""

from __future__ import annotations

import posixpath
import re
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

if TYPE_CHECKING:
    from components.comparison import ComparisonRule

BENCHMARKS = ("mmlu", "gsm8k", "multiarith", "svamp", "aqua", "math500", "humaneval")
"""the seven benchmarks of the paper (the default evaluation)"""
PREPARED_BENCHMARKS = (*BENCHMARKS, "splitinfo")
"""what ``data.benchmarks`` prepares by default: the seven plus the generated split-information task
(components/data/splitinfo.py), where silence is provable"""
ALL_BENCHMARKS = (*PREPARED_BENCHMARKS, "splitinfo2")
"""every benchmark name: plus the split-information task's second version (components/data/splitinfo_v2.py),
prepared when a profile names it (``proof_v2``), so the default data and its manifest stay as they were"""
EPS_LOW, EPS_HIGH = 3e-4, 4e-4
"""the paper's clip range [1 - 3e-4, 1 + 4e-4] of the sequence ratio: ``gspo.eps_low``/``eps_high``'s
defaults, :func:`components.gspo.loss.gspo_loss`'s, and the synthetic search objective's optimum"""


class _Section(BaseModel):
    # inf is refused like NaN: no size, rate or limit of this schema means "unbounded" by infinity.
    # strict: no coercion between types. Lax mode read `agents: true` as 1, `steps: '3'` and
    # `steps: 30.5`-like slips as numbers; an int is still accepted where a float is expected.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False, strict=True)


BenchmarkName = Literal["mmlu", "gsm8k", "multiarith", "svamp", "aqua", "math500", "humaneval", "splitinfo",
                        "splitinfo2"]
BaselineName = Literal["single_cot", "self_consistency", "mas_untrained", "mas_prior"]
BASELINE_NAMES: tuple[str, ...] = get_args(BaselineName)
Name = Annotated[str, Field(min_length=1, pattern=r"\S")]
"""a name, path or URI: an empty or blank one would silently mean the current folder or nothing"""
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]
"""what numpy, torch and Python's random all accept (and derived seeds stay in int64)"""
MAX_WAIT_S = 86_400.0
"""A day: the longest timeout or wait the schema takes. Far below what ``signal.alarm``,
``subprocess``'s and ``select``'s timeouts and ``time.sleep`` accept (an unbounded
``eval.code_timeout_s=1e10`` passed the schema, then overflowed in the scorer)."""
TRAIN_SOURCE_RE = re.compile(r"^(?P<bench>[a-z0-9]+)/(?P<split>[A-Za-z0-9_.-]+)$")


class DataConfig(_Section):
    benchmarks: list[BenchmarkName] = Field(
        default_factory=lambda: list(PREPARED_BENCHMARKS), min_length=1,
        description="benchmarks to prepare and validate")
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
    # the largest real items (docs/data.md): question 4,671 chars (MMLU), choice 881 (MMLU), answer 864 (HumanEval)
    max_question_chars: int = Field(16_000, ge=1, le=10_000_000,
                                    description="longest question (prompt) a prepared item may hold; validate "
                                    "refuses longer, evaluate/train/rollout refuse to read one")
    max_choice_chars: int = Field(2_000, ge=1, le=10_000_000, description="longest answer option of a choice item")
    max_answer_chars: int = Field(4_000, ge=1, le=10_000_000,
                                  description="longest gold answer (HumanEval: the canonical solution)")

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
    lora_rank: int = Field(0, ge=0, le=4096, description="LoRA rank (0 = full fine-tuning)")
    lora_alpha: int = Field(16, ge=1, le=65536, description="LoRA alpha")
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
    turn_order: Literal["simultaneous", "in_turn", "round0_in_turn"] = Field(
        "simultaneous", description="cyclic topologies: one batched call per round, or agents one after another "
                                    "(in_turn: every round; round0_in_turn: round 0 only, so a later agent hears "
                                    "the earlier agents' first answers before it speaks)")
    max_message_tokens: int = Field(128, ge=1, le=32768, description="hard cap on tokens per message")
    context_tokens: int = Field(1024, ge=64, le=1_048_576, description="budget of earlier messages kept in a prompt")
    silence_marker: Name = Field("<silent>",
                                description="the silence token (added to the tokenizer as one special token)")
    temperature: float = Field(0.8, ge=0.0, le=2.0, description="sampling temperature")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling")
    static_cache: bool = Field(False, description="static KV cache (+ torch.compile on CUDA) for decoding")
    decode: Literal["dynamic", "static_graph"] = Field(
        "dynamic", description="static_graph: a pooled static KV cache and a per-token step captured as one CUDA "
                               "graph per (rows, length) bucket (runs eagerly on CPU; components/mas/static_decode.py)")
    stop_check_every: int = Field(1, ge=1, le=64, description="static_graph decoding: read the all-rows-done flag "
                                                              "on the host once per this many tokens")
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
    lambda_tok: float = Field(0.1, ge=0.0, le=1e3,
                              description="initial token penalty (steered by the budget controller)")
    lambda_turn: float = Field(0.01, ge=0.0, le=1e3, description="penalty per non-silent message")
    lambda_rep: float = Field(0.1, ge=0.0, le=1e3, description="penalty for n-gram repetition (0..1)")
    token_measure: Literal["completion", "communicated", "total"] = Field(
        "completion", description="which token count the penalty and budget refer to")
    token_norm: float = Field(256.0, gt=0.0, le=1e9, description="B_norm: tokens are divided by this in the reward")
    repetition_ngram: int = Field(3, ge=1, le=64, description="n for the repetition n-gram overlap")
    per_agent_credit: bool = Field(False, description="charge each message its own cost (shaped credit)")


class BudgetConfig(_Section):
    enabled: bool = Field(True, description="steer lambda_tok with dual ascent")
    target: float = Field(400.0, gt=0.0, le=1e9, description="B: target mean tokens per episode (token_measure)")
    fraction: float | None = Field(None, gt=0.0, le=10.0,
                                   description="B = this x the untrained policy's sampled tokens per training episode, "
                                               "measured before step 1 (null: use target)")
    calibration_questions: int = Field(8, ge=1, le=100_000,
                                       description="training questions (x G episodes) that measure it")
    lr: float = Field(0.05, gt=0.0, le=1e3, description="eta: dual ascent step size (integral gain)")
    kp: float = Field(0.0, ge=0.0, le=1e3, description="proportional gain on the budget error (0 = plain dual ascent)")
    mode: Literal["cap", "target"] = Field(
        "cap", description="cap: spend at most B (lambda_tok in [lambda_min, lambda_max]); target: spend B (an "
                           "equality constraint, lambda_tok in [-lambda_max, lambda_max]: below B tokens earn a bonus)")
    lambda_min: float = Field(0.0, ge=0.0, le=1e3, description="lower bound of lambda_tok (cap mode)")
    lambda_max: float = Field(10.0, gt=0.0, le=1e3, description="upper bound of |lambda_tok|")

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
    steps: int = Field(200, ge=1, le=10_000_000, description="training steps (rollout batches)")
    questions_per_step: int = Field(8, ge=1, le=1024, description="questions per rollout batch")
    group_size: int = Field(8, ge=2, le=256, description="G: episodes sampled per question")
    minibatches: int = Field(4, ge=1, le=4096, description="mu: optimizer updates per rollout batch")
    eps_low: float = Field(EPS_LOW, ge=0.0, le=1.0, description="lower clip range of the sequence ratio")
    eps_high: float = Field(EPS_HIGH, ge=0.0, le=10.0, description="upper clip range of the sequence ratio")
    level: Literal["sequence", "sequence_token", "token"] = Field(
        "sequence", description="GSPO, GSPO-token, or GRPO-style token ratios (ablation)")
    kl_beta: float = Field(0.0, ge=0.0, le=1e3, description="KL penalty to the reference policy")
    log_kl_base: bool = Field(True, description="log KL(pi_old || base) on 16 messages a step (full FT keeps a "
                                                "frozen base copy; off under ZeRO-3 without LoRA)")
    adv_norm: Literal["group", "batch", "none"] = Field("group", description="advantage normalisation")
    group_by_agent_round: bool = Field(False, description="normalise per (question, agent, round)")
    adv_std_floor: float = Field(1e-6, gt=0.0, le=1e3, description="floor on the group std")
    lr: float = Field(1e-6, gt=0.0, le=1.0, description="learning rate")
    warmup_steps: int = Field(0, ge=0, le=10_000_000,
                              description="linear warm-up, in optimizer updates (minibatches per step)")
    lr_schedule: Literal["constant", "cosine", "linear"] = Field("constant", description="schedule after warm-up")
    lr_min_ratio: float = Field(0.0, ge=0.0, le=1.0,
                                description="floor of the decayed cosine/linear lr, a fraction of gspo.lr")
    share_prompts: bool = Field(False, description=(
        "training forwards run each prompt head shared by several messages once "
        "(components/gspo/shared_prompts.py): same log-probs and gradients up to rounding, ~2.5x the "
        "update's throughput; off by default because rounding changes which episodes a run samples"))
    weight_decay: float = Field(0.0, ge=0.0, le=10.0, description="AdamW weight decay")
    grad_clip: float = Field(1.0, gt=0.0, le=1e6, description="max gradient norm")
    grad_accum: int = Field(1, ge=1, le=4096, description="gradient accumulation steps per mini-batch")
    engine: Literal["deepspeed", "torch"] = Field("deepspeed", description="training engine")
    checkpoint_every: int = Field(25, ge=1, le=10_000_000, description="checkpoint every N steps")
    keep_checkpoints: int = Field(3, ge=1, le=10_000, description="keep the last K checkpoints")
    out_dir: Name = Field("runs/train", description="checkpoints and final policy")
    seed: Seed = Field(0, description="global seed")


class DeepSpeedConfig(_Section):
    zero_stage: Literal[0, 1, 2, 3] = Field(2, description="ZeRO stage")
    launcher: Literal["none", "deepspeed", "torchrun"] = Field("none", description="how the flow launches training")
    num_nodes: int = Field(1, ge=1, le=65536, description="nodes")
    nproc_per_node: int = Field(1, ge=1, le=1024, description="processes (GPUs) per node")
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
    trials: int = Field(20, ge=1, le=100_000, description="max trials")
    budget_tokens: int = Field(0, ge=0, le=10**9, description="stop after this many rollout tokens (0 = no limit)")
    budget_seconds: float = Field(0.0, ge=0.0, le=365 * 86400, description="stop after this wall-clock (0 = no limit)")
    max_tokens_per_episode: float = Field(400.0, gt=0.0, le=1e9, description="constraint on mean tokens per episode")
    storage: Name = Field("sqlite:///optuna.db", description="Optuna storage URL")
    study_name: Name = Field("agent-gspo", description="Optuna study name")
    trial_steps: int = Field(5, ge=1, le=1_000_000, description="training steps per trial")
    dev_items: int = Field(25, ge=1, le=10_000_000, description="held-out dev items per trial (per dev benchmark)")
    out_params: Name = Field("search/best_params.yaml", description="best parameters file read by train")


class EvalConfig(_Section):
    limit: int | None = Field(None, ge=1, le=10_000_000, description="items per benchmark (seeded sample); null = all")
    benchmarks: list[BenchmarkName] = Field(default_factory=lambda: list(BENCHMARKS), min_length=1,
                                            description="benchmarks to evaluate")
    baselines: list[BaselineName] = Field(
        default_factory=lambda: ["single_cot", "self_consistency", "mas_untrained"], description="baselines")
    self_consistency_k: int = Field(5, ge=1, le=1024, description="samples for self-consistency")
    batch_size: int = Field(16, ge=1, le=65536, description="questions per rollout batch")
    seed: Seed = Field(1234, description="seed of the item sample and sampling")
    out_dir: Name = Field("eval", description="evaluation outputs")
    code_timeout_s: float = Field(10.0, gt=0.0, le=MAX_WAIT_S, description="wall-clock limit per HumanEval program")


class GateConfig(_Section):
    """Thresholds of the paired rule the promotion gate decides with (components/comparison.py)."""

    test: Literal["paired_t"] = Field("paired_t", description="paired test over the shared items")
    confidence: float = Field(0.95, ge=0.5, lt=1.0, description="one-sided confidence of the bounds")
    margin: float = Field(0.02, ge=0.0, lt=1.0, description="non-inferiority margin on accuracy (cheaper)")
    token_factor: float = Field(0.9, gt=0.0, le=1.0, description="cheaper: tokens <= this x champion's")
    max_token_ratio: float = Field(1.10, ge=1.0, le=1e6, description="better: tokens <= this x champion's")
    min_items: int = Field(50, ge=2, le=10_000_000, description="fewer paired items decide nothing")

    def rule(self) -> ComparisonRule:
        """The :class:`components.comparison.ComparisonRule` of these thresholds."""
        from components.comparison import ComparisonRule  # lazy: scipy (~2.5 s), not for `agent-gspo --help`

        return ComparisonRule(self.confidence, self.margin, self.token_factor, self.max_token_ratio, self.min_items)


def model_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a registered model's name, or None.

    MLflow's rules (``mlflow.utils.validation._validate_model_name``: not blank, no ``/`` or ``:``,
    nothing a path normalisation changes such as ``..`` or ``./x``), checked here without importing
    MLflow (~3 s on every config load); ``tests/unit/tracking/test_registry_names.py`` holds the two rule
    sets together. Also refused: ``@`` (``models:/<name>@<alias>`` would read it as an alias) and
    surrounding whitespace (a name that looks like another)."""
    if not name.strip():
        return "empty or blank"
    if name != name.strip():
        return "leading or trailing whitespace"
    bad = sorted({c for c in name if c in "/:@"})
    if bad:
        return f"contains {' '.join(repr(c) for c in bad)} (registered model names cannot hold '/', ':' or '@')"
    norm = posixpath.normpath(name)
    if norm != name or norm == "." or norm.startswith(".."):
        return f"resolves to another name as a path ({norm!r})"
    return None


class SigningConfig(_Section):
    """The key that signs evaluation records and decisions, and what the gate accepts (docs/gate.md)."""

    key_file: str | None = Field(None, description="file holding the signing key (at least 32 characters; e.g. "
                                 "from a secret store, the same on every machine that evaluates or promotes). "
                                 "Unset: $AGENT_GSPO_SIGNING_KEY, else a key generated once (mode 0600) beside a "
                                 "sqlite registry's database or in ~/.config/agent-gspo/signing-key")
    accept_unsigned: bool = Field(False, description="accept evaluation records and decisions without a signature "
                                  "(only for a registry made before records were signed: a forger then simply "
                                  "leaves the signature out)")


class RegistryConfig(_Section):
    model_name: Name = Field("agent-gspo-policy", description="registered model name (MLflow's rules: no '/', "
                                                              "':', '@', '..', blank or padded names)")
    min_accuracy: float = Field(0.0, ge=0.0, le=1.0, description="absolute bar for the first champion")
    gate: GateConfig = Field(default_factory=GateConfig, description="the promotion gate's paired rule")
    signing: SigningConfig = Field(default_factory=SigningConfig, description="signed evaluation records: the "
                                   "key and what the gate accepts")

    @field_validator("model_name", mode="before")
    @classmethod
    def _registrable(cls, value: object) -> object:
        if isinstance(value, str) and (problem := model_name_problem(value)) is not None:
            raise ValueError(f"not a registered model name: {problem}")
        return value


class TrackingConfig(_Section):
    uri: Name = Field("sqlite:///mlflow.db", description="MLflow tracking URI")
    experiment: Name = Field("agent-gspo", description="MLflow experiment")
    log_model: bool = Field(True, description="log and register the final policy")
    outage_wait_s: float = Field(900.0, ge=0.0, le=MAX_WAIT_S,
                                 description="at the end of training, how long to wait for an "
                                 "unreachable tracking server (metrics are buffered meanwhile)")


NOT_PROTOCOL = ("temperature", "top_p", "static_cache", "decode", "stop_check_every")
"""``mas`` keys that do not change what a greedy evaluation computes"""


def protocol_of(mas: MasConfig) -> dict[str, Any]:
    """The ``mas`` settings that define the evaluated system's behaviour (an evaluation setting's
    ``protocol``; here, not in :mod:`components.evaluation.setting`, because the registry's
    :mod:`components.tracking.recorded` compares a version's settings with it too)."""
    return {k: v for k, v in mas.model_dump(mode="json").items() if k not in NOT_PROTOCOL}
