"""The study's own schema: ``params.yaml -> experiments``, typed and typo-rejecting.

The product (``components.config.Config``) keeps this section as an opaque mapping, so the product
never depends on the study; :func:`study_section` validates it here, every time the study reads a
config, with the same strictness as every other section (unknown keys, wrong types and bad
definitions are a :class:`ConfigError` naming ``experiments.<key path>``).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from components.config import Config, ConfigError, one_or_indented, parse_override
from components.config_sections import Name
from components.data.sampling import DEVSET, EVAL_SPLIT
from experiments.rules import RULES


class _StudySection(BaseModel):
    # as strict as the product's sections: no unknown key, no NaN / inf, no coercion between types
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False, strict=True)


EXPERIMENT_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
EXPERIMENT_FROZEN_SECTIONS = ("eval", "experiments", "profile")
"""sections an experiment may not override: every experiment is evaluated on the SAME seeded
sample (``eval.*``), and an experiment cannot redefine the experiments themselves"""


class ExperimentDef(_StudySection):
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


class RecordConfig(_StudySection):
    """Which experiment plays each role in the report's claims (a)-(f): the runs of record. The
    defaults are the paper's set; a results folder re-run under another recipe names its own runs
    here (``--set experiments.record.b25=NAME``), so the same rules judge it, and the report says so."""

    b25: str = Field("gspo_b25", description="the budgeted Agent-GSPO run of record (B = 25 %)")
    b50: str = Field("gspo_b50", description="the second budgeted run (B = 50 %)")
    lambda0: str = Field("lambda0", description="task reward only, under the same recipe as b25")
    no_adv_norm: str = Field("no_adv_norm", description="b25 with advantage normalisation off")
    grpo_token: str = Field("grpo_token", description="b25 with token-level importance ratios")
    rules: Literal[tuple(RULES)] | None = Field(  # type: ignore[valid-type]
        None, description="the verdict rule version that judges this results set (experiments/rules.py); no "
                          "default version: a report refuses to judge until the results set names its judge, "
                          "never 'the latest'")
    status: Literal["pre-registered", "exploratory"] | None = Field(
        None, description="exploratory: the set (its recipe, runs of record or role) was chosen after its results "
                          "or on test items; the report says so in a banner (None: no banner)")
    status_reason: str = Field("", description="one sentence: why the set is exploratory (printed in the banner)")

    @property
    def trained(self) -> tuple[str, str]:
        """the Agent-GSPO runs, the budgeted run of record first"""
        return (self.b25, self.b50)

    def roles(self) -> dict[str, str]:
        """role label (as the report names it) -> experiment"""
        return {"B25": self.b25, "B50": self.b50, "λ=0": self.lambda0, "no-adv-norm": self.no_adv_norm,
                "GRPO-token": self.grpo_token}


class ExperimentsConfig(_StudySection):
    profile: str = Field("results", description="profile `experiments run` uses when --profile is not given")
    results_dir: Name = Field("results", description="one <name>.json per experiment (committed)")
    runs_dir: Name = Field("runs/experiments", description="per-experiment training and evaluation folders")
    report: Name = Field("docs/results.md", description="generated report; PNGs go to <report dir>/<stem>/")
    eval_split: Literal[EVAL_SPLIT, DEVSET] = Field(  # type: ignore[valid-type]
        EVAL_SPLIT, description="what every experiment of a run is evaluated on: test (the seeded test sample the "
                                "report's claims are about) or devset (components/data/devset.py: items disjoint "
                                "from that sample, where recipes, caps and budgets are chosen; issue 52)")
    last_k: int = Field(5, ge=1, le=1_000_000,
                        description="last training steps averaged when checking tokens against B")
    definitions: dict[str, ExperimentDef] = Field(default_factory=dict, description="name -> experiment")
    record: RecordConfig = Field(default_factory=RecordConfig,
                                 description="the runs of record the claims judge, and the rule version")

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
        for role, spec in RecordConfig.model_fields.items():  # a default that names nothing is NOT RUN
            if role in ("rules", "status", "status_reason"):
                continue
            name = getattr(self.record, role)
            if name != spec.default and name not in defs:
                raise ValueError(f"record.{role}: unknown experiment {name!r} (defined: {', '.join(defs) or 'none'})")
        return self


def study_section(cfg: Config) -> ExperimentsConfig:
    """``cfg.experiments`` validated by the study's schema; :class:`ConfigError` names each bad key as
    ``experiments.<path>`` (and the profile), like the product's own config errors."""
    try:
        return ExperimentsConfig.model_validate(cfg.experiments)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            path = ".".join(["experiments", *(str(p) for p in err["loc"])])
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
            got = "" if isinstance(err.get("input"), dict) else f" (got {str(repr(err.get('input')))[:120]})"
            problems.append(f"{path}: {msg}{got}")
        header = f"experiments (profile {cfg.profile}): invalid configuration"
        raise ConfigError(one_or_indented(header, problems)) from exc
