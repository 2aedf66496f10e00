"""The best-parameters file (``search.out_params``) written by a search and read by ``train``.

Layout (YAML)::

    params:            # section -> key -> value, the same shape as params.yaml
      reward: {lambda_tok: 0.0123}
      mas: {agents: 3, topology: star}
    best:              # provenance only; load_best_params ignores it
      study: agent-gspo
      trial: 7
      dev_accuracy: 0.61
      mean_tokens_per_episode: 352.0
      constraint: -48.0
      feasible: true

``params`` has the shape of a profile in ``params.yaml`` so it can be pasted there; train
applies it with ``load_config(overrides=load_best_params(path))``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from components.config import parse_override
from components.io import write_text_atomic
from components.search.errors import SearchError
from components.search.space import format_override
from components.yaml_strict import FileTooLarge, one_line, read_capped_text, strict_load

PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""a section or key name in ``params``: each becomes part of a ``section.key=value`` override"""


def overrides_to_params(overrides: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``["a.b=1", ...]`` -> ``{"a": {"b": 1}}`` (only ``section.key`` depth is supported)."""
    params: dict[str, dict[str, Any]] = {}
    for text in overrides:
        keys, value = parse_override(text)
        if len(keys) != 2:
            raise SearchError(f"override {text!r}: expected section.key=value")
        params.setdefault(keys[0], {})[keys[1]] = value
    return params


def write_best_params(path: str | os.PathLike[str], overrides: Sequence[str],
                      best: Mapping[str, Any]) -> Path:
    """Write the params file atomically (a crash never leaves half a file for train to read)."""
    target = Path(path)
    doc = {"params": overrides_to_params(overrides), "best": dict(best)}
    header = "# Best hyper-parameters found by `agent-gspo search`; train reads `params`.\n"
    write_text_atomic(target, header + yaml.safe_dump(doc, sort_keys=False))
    return target


def load_best_params(path: str | os.PathLike[str]) -> list[str]:
    """Read a params file; return its ``params`` as ``section.key=value`` overrides for ``load_config``.

    Raises :class:`SearchError` naming the file when it is missing or malformed.
    """
    source = Path(path)
    if source.is_dir():
        raise SearchError(f"{source}: is a folder, not a best-params file (give the file search.out_params names)")
    if not source.is_file():
        raise SearchError(f"{source}: best-params file not found (run `agent-gspo search` first, "
                          f"or point search.out_params at an existing file)")
    try:
        doc = strict_load(read_capped_text(source))
    except (OSError, UnicodeDecodeError, FileTooLarge) as exc:
        raise SearchError(f"{source}: cannot read the best-params file: {exc}") from exc
    except yaml.YAMLError as exc:
        raise SearchError(f"{source}: not valid YAML: {one_line(exc)}") from exc
    params = doc.get("params") if isinstance(doc, dict) else None
    if not isinstance(params, dict):
        raise SearchError(f"{source}: expected a mapping with a 'params' section (section -> key -> value)")
    overrides: list[str] = []
    for section, values in params.items():
        if not isinstance(values, dict):
            raise SearchError(f"{source}: params.{section} must be a mapping of key -> value, got {values!r}")
        for name in (section, *values):  # "lr=5" or "a.b" would become another key in section.key=value
            if not isinstance(name, str) or not PLAIN_NAME.fullmatch(name):
                raise SearchError(f"{source}: params.{section}: {name!r} is not a setting's name (letters, digits, _)")
        overrides.extend(format_override(f"{section}.{key}", value) for key, value in values.items())
    return overrides
