"""The hyper-parameter search space and the ``section.key=value`` overrides it produces.

A trial's parameters travel as the same override strings the CLI and ``load_config`` accept
(``reward.lambda_tok=0.0123``), so the best trial can be replayed by ``train`` with no
translation layer: ``load_config(overrides=load_best_params(path))``.

Default ranges (:data:`DEFAULT_SPACE`; pass a partial dict to :class:`SearchSpace` to change
entries, or map a key to ``None`` to keep it fixed at the config value):

===================  ================================  =============================================
key                  range                              why
===================  ================================  =============================================
reward.lambda_tok    1e-3 .. 1.0, log                   penalty spans orders of magnitude; 0.1 default
budget.target        100 .. 800, step 50                around the 400-token default budget B
gspo.lr              1e-7 .. 1e-5, log                  GSPO fine-tuning rates for ~100M-1B models
gspo.group_size      {4, 8, 12, 16} (int, step 4)       G >= 4 keeps group advantages meaningful
gspo.eps_low         1e-4 .. 1e-3, log                  around the paper's 3e-4
gspo.eps_high        tied: eps_low * 4/3                keeps the paper's 3e-4 : 4e-4 asymmetry
mas.agents           2 .. 5                             1 agent is no MAS; >5 rarely pays on 135M
mas.rounds           1 .. 3                             more rounds = more tokens, diminishing returns
mas.topology         complete/chain/star/layered/debate  "custom" needs a matrix, so it is excluded
===================  ================================  =============================================

``agent-gspo search`` uses :meth:`SearchSpace.within`: sizes (G, agents, rounds, ...) never exceed
the profile's own values, so memory and time per trial stay those of the profile.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
import yaml
from pydantic import ValidationError

from components.config import Config, ConfigError, set_override
from components.search.errors import SearchError


class SearchSpaceError(SearchError):
    """A search-space entry that names an unknown config key or has an invalid range."""


@dataclass(frozen=True)
class FloatParam:
    """A float in ``[low, high]``; ``log`` samples uniformly in log space."""

    low: float
    high: float
    log: bool = False
    step: float | None = None


@dataclass(frozen=True)
class IntParam:
    """An int in ``[low, high]`` with ``step``."""

    low: int
    high: int
    step: int = 1
    log: bool = False


@dataclass(frozen=True)
class CategoricalParam:
    """One of ``choices`` (YAML scalars)."""

    choices: tuple[Any, ...]


@dataclass(frozen=True)
class TiedParam:
    """Not searched: ``value = ratio * value_of(source)``; ``source`` must be suggested earlier."""

    source: str
    ratio: float


ParamSpec = FloatParam | IntParam | CategoricalParam | TiedParam

DEFAULT_SPACE: dict[str, ParamSpec] = {
    "reward.lambda_tok": FloatParam(1e-3, 1.0, log=True),
    "budget.target": FloatParam(100.0, 800.0, step=50.0),
    "gspo.lr": FloatParam(1e-7, 1e-5, log=True),
    "gspo.group_size": IntParam(4, 16, step=4),
    "gspo.eps_low": FloatParam(1e-4, 1e-3, log=True),
    "gspo.eps_high": TiedParam("gspo.eps_low", 4.0 / 3.0),
    "mas.agents": IntParam(2, 5),
    "mas.rounds": IntParam(1, 3),
    "mas.topology": CategoricalParam(("complete", "chain", "star", "layered", "debate")),
}
"""Default search space, in suggestion order (tied entries follow their source)."""

SIZE_KEYS = ("gspo.group_size", "gspo.questions_per_step", "mas.agents", "mas.rounds", "mas.max_message_tokens",
             "mas.context_tokens")
"""Keys that set how big a rollout is; :meth:`SearchSpace.within` caps them at the profile's values."""


def format_value(value: Any) -> str:
    """``value`` as a YAML scalar that ``yaml.safe_load`` reads back identically.

    Why not ``str``/``json``: PyYAML (YAML 1.1) reads ``1e-06`` as a *string*; its own dumper
    writes ``1.0e-06``, which round-trips exactly.
    """
    text = yaml.safe_dump(value, default_flow_style=True)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def format_override(key: str, value: Any) -> str:
    """``section.key=value`` with a round-trippable value (see :func:`format_value`)."""
    return f"{key}={format_value(value)}"


def _config_keys() -> set[str]:
    keys: set[str] = set()
    for section, field in Config.model_fields.items():
        sub = getattr(field.annotation, "model_fields", None)
        if sub:
            keys.update(f"{section}.{k}" for k in sub)
    return keys


def _check_spec(key: str, spec: ParamSpec, earlier: Sequence[str]) -> None:
    where = f"search space entry {key!r}"
    if isinstance(spec, FloatParam | IntParam):
        if not spec.low <= spec.high:
            raise SearchSpaceError(f"{where}: low {spec.low} must be <= high {spec.high}")
        if spec.log and spec.low <= 0:
            raise SearchSpaceError(f"{where}: a log range needs low > 0, got {spec.low}")
        if spec.step is not None and spec.log:
            raise SearchSpaceError(f"{where}: step and log cannot be combined")
    elif isinstance(spec, CategoricalParam):
        if not spec.choices:
            raise SearchSpaceError(f"{where}: choices must not be empty")
    elif isinstance(spec, TiedParam):
        if spec.source not in earlier:
            raise SearchSpaceError(f"{where}: tied to {spec.source!r}, which must be a searched entry "
                                   f"listed before it (have: {', '.join(earlier) or 'none'})")
        if not math.isfinite(spec.ratio) or spec.ratio <= 0:
            raise SearchSpaceError(f"{where}: ratio must be a positive number, got {spec.ratio}")
    else:
        raise SearchSpaceError(f"{where}: expected FloatParam, IntParam, CategoricalParam or TiedParam, "
                               f"got {type(spec).__name__}")


class SearchSpace:
    """An ordered mapping ``section.key -> ParamSpec`` with :meth:`suggest`.

    ``ranges`` updates :data:`DEFAULT_SPACE` (new keys are appended; ``None`` removes a key,
    i.e. keeps the config value). Every key must exist in the config schema.
    """

    def __init__(self, ranges: Mapping[str, ParamSpec | None] | None = None, *,
                 use_defaults: bool = True) -> None:
        merged: dict[str, ParamSpec | None] = dict(DEFAULT_SPACE) if use_defaults else {}
        merged.update(ranges or {})
        known = _config_keys()
        self.specs: dict[str, ParamSpec] = {}
        for key, spec in merged.items():
            if key not in known:
                raise SearchSpaceError(f"search space entry {key!r}: not a config key "
                                       f"(expected section.key, e.g. reward.lambda_tok)")
            if spec is None:
                continue
            _check_spec(key, spec, [k for k, s in self.specs.items() if not isinstance(s, TiedParam)])
            self.specs[key] = spec

    @classmethod
    def within(cls, cfg: Config, ranges: Mapping[str, ParamSpec | None] | None = None) -> SearchSpace:
        """The space (default plus ``ranges``) with every size in :data:`SIZE_KEYS` capped at ``cfg``'s value.

        A profile's sizes bound its search: the smoke profile (G 2, 3 agents, 2 rounds) must not
        run a trial with G 12 and 5 agents (19 GB instead of a few). A range that starts above the
        profile's value is dropped, so the key keeps the profile's value.
        """
        merged: dict[str, ParamSpec | None] = dict(DEFAULT_SPACE)
        merged.update(ranges or {})
        flat = cfg.flat()
        for key in SIZE_KEYS:
            spec = merged.get(key)
            if not isinstance(spec, IntParam) or spec.high <= int(flat[key]):
                continue
            cap = int(flat[key])
            high = spec.low + (cap - spec.low) // spec.step * spec.step
            merged[key] = IntParam(spec.low, high, spec.step, spec.log) if cap >= spec.low else None
        return cls(merged, use_defaults=False)

    def sample(self, trial: optuna.Trial) -> dict[str, Any]:
        """Suggest every entry on ``trial``; return ``{section.key: value}`` (tied ones included)."""
        values: dict[str, Any] = {}
        for key, spec in self.specs.items():
            if isinstance(spec, FloatParam):
                values[key] = trial.suggest_float(key, spec.low, spec.high, log=spec.log, step=spec.step)
            elif isinstance(spec, IntParam):
                values[key] = trial.suggest_int(key, spec.low, spec.high, step=spec.step, log=spec.log)
            elif isinstance(spec, CategoricalParam):
                values[key] = trial.suggest_categorical(key, list(spec.choices))
            else:
                values[key] = float(values[spec.source]) * spec.ratio
        return values

    def suggest(self, trial: optuna.Trial) -> list[str]:
        """Suggest every entry on ``trial``; return config overrides ``section.key=value``."""
        return [format_override(k, v) for k, v in self.sample(trial).items()]


def suggest(trial: optuna.Trial, space: SearchSpace | None = None) -> list[str]:
    """Overrides ``section.key=value`` for ``trial`` from ``space`` (default: :data:`DEFAULT_SPACE`)."""
    return (space or SearchSpace()).suggest(trial)


def apply_overrides(cfg: Config, overrides: Sequence[str]) -> Config:
    """A validated copy of ``cfg`` with ``overrides`` applied (same parser as ``load_config``).

    Raises :class:`ConfigError` naming the overrides when the result violates the schema.
    """
    raw: dict[str, Any] = cfg.model_dump(mode="json")
    for text in overrides:
        set_override(raw, text)
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        details = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"search overrides {list(overrides)} give an invalid config: {details}") from exc
