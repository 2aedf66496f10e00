"""Every numeric setting of the schema has both bounds, values the code can honour: the walk finds
each int/float field (nested sections, experiment definitions, optional ones) and a config load
refuses an absurd value for each (1e10 or 10**10, -1, NaN, inf) with an error naming the key."""

from __future__ import annotations

import copy
import math
import types
import typing

import annotated_types as at
import pytest
import yaml
from helpers.paths import REPO_ROOT
from pydantic import BaseModel, ValidationError

from components.config import Config, ConfigError, format_errors, load_config, set_override
from components.errors import run_command

PARAMS = REPO_ROOT / "params.yaml"
UNBOUNDED_OK = {
    "mas.adjacency": "a 0/1 matrix: MasConfig's validator refuses any other entry and any other shape",
}
"""numeric fields without both bounds, each with the reason it is safe"""
_DEFINITION = next(name for name, d in yaml.safe_load(PARAMS.read_text())["experiments"]["definitions"].items()
                   if d.get("kind", "gspo") == "gspo")


def _numeric(annotation: typing.Any) -> type | None:
    if annotation in (int, float):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return next((a for a in typing.get_args(annotation) if a in (int, float)), None)
    return None


def _walk(model: type[BaseModel], prefix: str = "") -> typing.Iterator[tuple[str, typing.Any, list, list]]:
    """(key, type or annotation, lower bounds, upper bounds) of every field holding numbers."""
    for name, field in model.model_fields.items():
        ann, key = field.annotation, prefix + name
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _walk(ann, key + ".")
            continue
        if typing.get_origin(ann) is dict and isinstance(typing.get_args(ann)[1], type) \
                and issubclass(typing.get_args(ann)[1], BaseModel):
            yield from _walk(typing.get_args(ann)[1], f"{key}.{_DEFINITION}.")
            continue
        kind = _numeric(ann)
        if kind is None and ("int" in str(ann) or "float" in str(ann)) and "Literal" not in str(ann):
            kind = ann  # numbers inside a container
        if kind is not None:
            yield (key, kind, [m for m in field.metadata if isinstance(m, at.Ge | at.Gt)],
                   [m for m in field.metadata if isinstance(m, at.Le | at.Lt)])


FIELDS = list(_walk(Config))
NUMERIC = [(key, kind) for key, kind, _, _ in FIELDS if kind in (int, float) and key not in UNBOUNDED_OK]


def test_the_walk_finds_the_numeric_settings() -> None:
    keys = {key for key, *_ in FIELDS}
    assert {"eval.code_timeout_s", "gspo.steps", "mas.adjacency", "tracking.outage_wait_s", "eval.limit",
            "gspo.seed"} <= keys  # experiments.*: the study's schema (tests/experiments/test_study_cli.py)
    assert len(NUMERIC) >= 55


@pytest.mark.parametrize(("key", "kind", "low", "high"), FIELDS, ids=[f[0] for f in FIELDS])
def test_every_numeric_setting_has_both_bounds(key: str, kind: typing.Any, low: list, high: list) -> None:
    if key in UNBOUNDED_OK:
        assert UNBOUNDED_OK[key], "an allow-listed field needs its reason"
        return
    assert kind in (int, float), f"{key}: numbers in a container need an entry in UNBOUNDED_OK with the reason"
    assert low and high, f"{key}: lower bound {low}, upper bound {high}: both are needed"
    upper = getattr(high[0], "le", None) or high[0].lt
    assert math.isfinite(upper) and upper < 1e10, f"{key}: an upper bound of {upper} is no bound"


ABSURD = ("1e10", "10000000000", "-1", ".nan", ".inf", "-.inf")


@pytest.fixture(scope="module")
def loaded() -> dict:
    return load_config(PARAMS).model_dump(mode="json")


@pytest.mark.parametrize(("key", "kind"), NUMERIC, ids=[k for k, _ in NUMERIC])
def test_an_absurd_value_is_refused_naming_the_key(loaded: dict, key: str, kind: type) -> None:
    """What :func:`load_config` does after reading the file (one full load per value is ~0.1 s)."""
    for value in ABSURD:
        raw = copy.deepcopy(loaded)
        set_override(raw, f"{key}={value}")
        with pytest.raises(ValidationError) as err:
            Config.model_validate(raw)
        assert f"{key}: " in format_errors(err.value, "params.yaml"), f"{key}={value}: {err.value}"


@pytest.mark.parametrize("value", ABSURD)
def test_config_load_refuses_it(value: str) -> None:
    with pytest.raises(ConfigError, match="eval.code_timeout_s: Input should be"):
        load_config(PARAMS, overrides=[f"eval.code_timeout_s={value}"])


def test_the_overflowing_timeout_is_exit_2(capsys) -> None:
    assert run_command("score", lambda: load_config(PARAMS, overrides=["eval.code_timeout_s=1e10"])) == 2
    err = capsys.readouterr().err
    assert "eval.code_timeout_s" in err and "less than or equal to 86400" in err and "Traceback" not in err
