"""A fresh copy of this checkout (tracked and new files, no ignored outputs), as a clone would be."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from helpers.paths import REPO_ROOT

ROOT = REPO_ROOT


def copy_checkout(dest: Path) -> Path:
    """Copy the repository's tracked and untracked-but-not-ignored files into ``dest`` (no git history)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True, timeout=60).stdout.split()
    for rel in files:
        src = ROOT / rel
        if src.is_file() and not rel.startswith("mlruns/"):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest
