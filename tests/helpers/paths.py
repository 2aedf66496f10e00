"""Where things are, for tests at any depth under tests/ (no ``Path(__file__).parents[k]`` to keep
in step with a file's folder; written by the issue-50 test move)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType


def _repo_root() -> Path:
    here = Path(__file__).resolve()
    for folder in here.parents:
        if (folder / "pyproject.toml").is_file() and (folder / "tests").is_dir():
            return folder
    raise RuntimeError(f"no repository root (a folder with pyproject.toml and tests/) above {here}")


REPO_ROOT = _repo_root()
TESTS_DIR = REPO_ROOT / "tests"


def find_under_tests(name: str) -> Path:
    """The one file called ``name`` anywhere under tests/ (names are unique there: pytest's import mode
    needs it)."""
    found = sorted(p for p in TESTS_DIR.rglob(name) if "__pycache__" not in p.parts)
    if len(found) != 1:
        raise LookupError(f"{len(found)} files called {name!r} under {TESTS_DIR} (want exactly one)")
    return found[0]


def load_test_module(name: str) -> ModuleType:
    """Test module ``name`` (e.g. ``test_tracking_helpers``) imported as pytest imports it: its folder
    first on sys.path, the same ``sys.modules`` entry, assertions rewritten."""
    if name in sys.modules:
        return sys.modules[name]
    folder = str(find_under_tests(f"{name}.py").parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(name)
