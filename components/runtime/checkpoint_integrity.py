"""The sha256 list a checkpoint's ``meta.json`` holds (format 2) and its check on ``--resume``.

Why: a flipped low bit of a weight, an optimizer moment or an RNG state parses and is finite, so
no loader or content check notices; the run would go on from silently different numbers.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

META = "meta.json"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _files(folder: Path) -> list[str]:
    """Every file under ``folder`` but ``meta.json`` (which holds the hashes), relative, sorted."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and p.relative_to(folder).as_posix() != META)


def hash_files(folder: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file of a checkpoint folder but ``meta.json``."""
    return {name: _sha256(folder / name) for name in _files(folder)}


def integrity_problem(folder: Path, listed: dict[str, str]) -> tuple[str, str] | None:
    """(file, what is wrong) for the first file that changed, is missing or was added; None if all match."""
    found = set(_files(folder))
    for name, want in sorted(listed.items()):
        if name not in found:
            return name, f"missing from the checkpoint (listed in {META})"
        if _sha256(folder / name) != want:
            return name, f"content changed since the checkpoint was written (its sha256 differs from {META})"
    added = sorted(found - set(listed))
    if added:
        return added[0], f"not part of the checkpoint (not listed in {META})"
    return None
