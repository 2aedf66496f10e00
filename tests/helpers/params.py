"""Params files for tests."""

from __future__ import annotations

from pathlib import Path


def defaults_params(folder: Path) -> Path:
    """An empty params file in ``folder``: the schema defaults (a params file that is named must exist)."""
    path = folder / "defaults.yaml"
    path.write_text("")
    return path
