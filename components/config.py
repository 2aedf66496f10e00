"""Typed schema of ``params.yaml`` and its profiles.

One config for the CLI, the Prefect flows and the DVC stages. ``params.yaml`` holds every
section with its defaults; ``profiles.<name>`` holds partial overrides deep-merged on top.
Every model forbids unknown keys, so a typo is an error that names the key path, never a
silently ignored setting. Load with :func:`load_config`; errors raise :class:`ConfigError`
(the CLI turns it into exit code 2). The sections (``data`` ... ``tracking``) are in
:mod:`components.config_sections`; this module assembles :class:`Config` and reads the file with
its profile and ``--set`` overrides.

The ``experiments`` section belongs to the study (the top-level ``experiments`` package, which the
product never imports): here it is an opaque mapping, and ``experiments.schema`` validates it with
its own typed, typo-rejecting schema whenever the study runs. Typing it here would put the study's
schema back inside the product (and its definitions' override checks need :class:`Config` itself);
leaving it out of ``params.yaml`` would split one params file in two. Every other section is still
checked here, key by key. Neither :meth:`Config.hash` nor :meth:`Config.flat` reads it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from components.config_sections import (
    ALL_BENCHMARKS,
    BASELINE_NAMES,
    BENCHMARKS,
    TRAIN_SOURCE_RE,
    BaselineName,
    BenchmarkName,
    BudgetConfig,
    DataConfig,
    DeepSpeedConfig,
    EvalConfig,
    GspoConfig,
    MasConfig,
    ModelConfig,
    Name,
    RegistryConfig,
    RewardConfig,
    SearchConfig,
    Seed,
    TrackingConfig,
    _Section,
)
from components.errors import MAX_SHOWN, UserError
from components.io import register_pipeline_inputs
from components.redact import redact_value
from components.yaml_strict import FileTooLarge, read_capped_text, strict_load
from components.yaml_strict import one_line as _one_line

__all__ = [  # the schema's sections live in components/config_sections.py; import them from here
    "ALL_BENCHMARKS", "BASELINE_NAMES", "BENCHMARKS", "DEFAULT_PARAMS", "TRAIN_SOURCE_RE", "BaselineName",
    "BenchmarkName", "BudgetConfig", "Config", "ConfigError", "DataConfig", "DeepSpeedConfig", "EvalConfig",
    "GspoConfig", "MasConfig", "ModelConfig", "Name", "RegistryConfig",
    "RewardConfig", "SearchConfig", "Seed", "TrackingConfig", "deep_merge", "format_errors", "load_config",
    "one_or_indented",
    "parse_override", "rank_split_problem", "read_params_file", "set_override",
]

DEFAULT_PARAMS = Path("params.yaml")


class ConfigError(UserError):
    """A params file or override that does not match the schema."""


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
    experiments: dict[str, Any] = Field(
        default_factory=dict, description="the study's section (experiments/, `python -m experiments keys`): "
                                          "validated by the study's own schema, opaque to the product")
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


def _shown(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= MAX_SHOWN else shown[:MAX_SHOWN - 3] + "..."


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``section.key=value`` (value as YAML) into a key path and a value."""
    if "=" not in text:
        raise ConfigError(f"override {_shown(text)}: expected section.key=value")
    key, raw = text.split("=", 1)
    keys = key.strip().split(".")
    if len(keys) > MAX_KEY_PATH:
        raise ConfigError(f"override {_shown(text)}: a key path of {len(keys)} names (settings are at most "
                          f"{MAX_KEY_PATH} deep)")
    if not all(k.strip() for k in keys):
        raise ConfigError(f"override {_shown(text)}: empty name in the key path {_shown(key.strip())} "
                          "(expected section.key=value)")
    if keys[0] in ("profile", "profiles"):
        raise ConfigError(f"override {_shown(text)}: {keys[0]} is not a setting; choose a profile with --profile NAME "
                          "(or $AGENT_GSPO_PROFILE), and edit profiles in the params file")
    try:
        value = strict_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {_shown(text)}: value is not valid YAML ({_one_line(exc)})") from exc
    return keys, value


def set_override(raw: dict[str, Any], text: str) -> None:
    """Apply one ``section.key=value`` override to a raw (unvalidated) config mapping in place."""
    keys, value = parse_override(text)
    node = raw
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {_shown(text)}: {k} is not a section")
    node[keys[-1]] = value


YAML11_BOOLEANS = frozenset({"yes", "no", "on", "off", "y", "n"})
"""YAML 1.1 spellings of booleans, strings here (:mod:`components.yaml_strict`): named in the error"""


def format_errors(exc: ValidationError, source: str) -> str:
    """A pydantic error as one line, ``source: invalid configuration: key.path: what is wrong``; with
    several problems, ``source: invalid configuration`` then one indented line per key path."""
    problems = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "<root>"
        path = path if len(path) <= MAX_SHOWN else path[:MAX_SHOWN - 3] + "..."
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
        # at the root, or under a model-level validator, the input is a whole section: the message names the keys
        got = f" (got {_shown(err.get('input'))})" if err["loc"] and not isinstance(err.get("input"), dict) else ""
        problems.append(f"{path}: {msg}{got}")
    return one_or_indented(f"{source}: invalid configuration", problems)


def one_or_indented(header: str, problems: list[str]) -> str:
    """``header: problem`` for one problem (the CLI's one-line error), else the header and one indented
    line per problem."""
    if len(problems) == 1:
        return f"{header}: {problems[0]}"
    return "\n".join([header, *(f"  {p}" for p in problems)])


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
    raw_read = path.exists() or path.is_symlink()
    if raw_read:
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
        cfg = Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, f"{path} (profile {profile})")) from exc
    register_pipeline_inputs(path if raw_read else None, cfg.data.out_dir, cfg.data.mirror)
    return cfg
