"""``agent-gspo config``: every ``--set`` key with its type, default and description, and a profile's
resolved config as YAML.

One source of truth: the pydantic schema (:mod:`components.config_sections`, :mod:`components.config`).
Its ``Field(description=...)`` sits beside the type and default that validation enforces, every leaf
has one (``tests/unit/test_cli_config.py``), and it is reachable without parsing YAML comments;
the comments in ``params.yaml`` explain the chosen values and the profiles' overrides, not the keys.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from components.config import Config
from components.errors import UserError
from components.redact import redact_value

NAME = "<name>"
"""the placeholder for a user-chosen key (``experiments.definitions.<name>.kind``)"""


@dataclass(frozen=True)
class KeyDoc:
    key: str
    type: str
    default: Any
    description: str


def _model_of(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _named_models(annotation: Any) -> type[BaseModel] | None:
    """``V`` of a ``dict[str, V]`` whose values are sections (``experiments.definitions``)."""
    if typing.get_origin(annotation) is dict:
        return _model_of(typing.get_args(annotation)[1])
    return None


def type_name(annotation: Any) -> str:
    """A short readable type: ``int``, ``a|b`` for a Literal, ``list[str]``, ``float|null``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is typing.Literal:
        return "|".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return "|".join("null" if a is type(None) else type_name(a) for a in args)
    if origin in (list, tuple, set, dict):
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args if a is not Ellipsis)}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: Any) -> Any:
    value = field.get_default(call_default_factory=True)
    return None if value is PydanticUndefined else value


def schema_keys(model: type[BaseModel] = Config, prefix: str = "") -> Iterator[KeyDoc]:
    """Every leaf key of the schema, in declaration order."""
    for name, field in model.model_fields.items():
        key = prefix + name
        sub = _model_of(field.annotation)
        named = _named_models(field.annotation)
        if sub is not None:
            yield from schema_keys(sub, key + ".")
        elif named is not None:
            yield KeyDoc(key, f"dict[str, {named.__name__}]", _default(field), field.description or "")
            yield from schema_keys(named, f"{key}.{NAME}.")
        else:
            yield KeyDoc(key, type_name(field.annotation), _default(field), field.description or "")


def _shown(value: Any) -> str:
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, dict) and value:
        return "{...}"
    return json.dumps(redact_value(value), ensure_ascii=False, default=str)


def _value(cfg: Config, key: str) -> Any:
    """``key``'s value in ``cfg`` (a ``<name>`` key has none: the schema default is shown)."""
    value: Any = cfg
    for part in key.split("."):
        if part == NAME:
            raise KeyError(key)
        value = value[part] if isinstance(value, dict) else getattr(value, part)
    return value


def format_keys(cfg: Config, section: str | None = None) -> str:
    """One line per key: ``key  type  default ...  description``, columns aligned; the default is
    the value in ``cfg`` (params.yaml with its profile and overrides), else the schema's."""
    docs = [d for d in schema_keys() if section is None or d.key.split(".")[0] == section]
    if not docs:
        sections = sorted({d.key.split(".")[0] for d in schema_keys()})
        raise UserError(f"--section {section!r}: no such section (sections: {', '.join(sections)})")
    kw = max(len(d.key) for d in docs)
    tw = min(max(len(d.type) for d in docs), 28)
    lines = [f"# --set keys; defaults of profile {cfg.profile!r} (params.yaml), <name>: schema defaults"]
    for d in docs:
        try:
            value = _value(cfg, d.key)
        except KeyError:
            value = d.default
        lines.append(f"{d.key:<{kw}}  {d.type:<{tw}}  default {_shown(value)}  {d.description}".rstrip())
    return "\n".join(lines)


def resolved_yaml(cfg: Config) -> str:
    """The resolved config (params.yaml, the profile, every ``--set``) as YAML, URI passwords as ``***``."""
    return yaml.safe_dump(redact_value(cfg.model_dump(mode="json")), sort_keys=False, allow_unicode=True)
