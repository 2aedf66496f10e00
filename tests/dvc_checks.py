"""What the DVC tests check: is the committed ``dvc.lock`` the lock of this code and these params?

``dvc status --json`` compares every locked stage with the workspace. Outputs of other stages
(``data/``, ``runs/smoke/final``) are absent in a fresh checkout and differ after a local run, so
only the code and params a stage depends on are held against the lock, and a stage that should
be locked but is not counts as stale too. Regenerate with ``dvc repro && git add dvc.lock metrics``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

PIPELINES = ("dvc.yaml", "experiments/dvc.yaml")


def _stages(root: Path) -> dict[str, dict]:
    out = {}
    for rel in PIPELINES:
        prefix = "" if rel == "dvc.yaml" else f"{rel}:"
        for name, stage in (yaml.safe_load((root / rel).read_text()).get("stages") or {}).items():
            out[prefix + name] = stage
    return out


def _paths(entries: list) -> list[str]:
    return [next(iter(e)) if isinstance(e, dict) else str(e) for e in entries or []]


def stage_outputs(root: Path) -> set[str]:
    """Every out, metric and plot path of every stage (relative to the repository root)."""
    outs: set[str] = set()
    for stage in _stages(root).values():
        for key in ("outs", "metrics", "plots"):
            outs.update(_paths(stage.get(key)))
    return outs


def _locked(root: Path) -> set[str]:
    names: set[str] = set()
    for rel in PIPELINES:
        lock = root / Path(rel).with_name("dvc.lock")
        prefix = "" if rel == "dvc.yaml" else f"{rel}:"
        if lock.is_file():
            names.update(prefix + n for n in (yaml.safe_load(lock.read_text()).get("stages") or {}))
    return names


def stale_lock(root: Path) -> list[str]:
    """Reasons the committed lock does not match the code and params (empty: it matches)."""
    stages = _stages(root)
    locked = _locked(root)
    problems = [f"{name}: not in dvc.lock" for name in stages if name not in locked]
    res = subprocess.run(["dvc", "status", "--json"], cwd=root, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        return problems + [f"dvc status failed ({res.returncode}): {res.stderr[-2000:]}"]
    status = json.loads(res.stdout or "{}")
    outputs = stage_outputs(root)
    for name, changes in status.items():
        if name not in locked:
            continue
        for change in changes:
            if not isinstance(change, dict):
                problems.append(f"{name}: {change}")
                continue
            if "changed command" in change:
                problems.append(f"{name}: command changed")
            for dep, what in (change.get("changed deps") or {}).items():
                if isinstance(what, dict):  # a params file: {key: modified | new | deleted}
                    problems += [f"{name}: param {key} {state}" for key, state in what.items()]
                elif dep not in outputs:
                    problems.append(f"{name}: {dep} {what}")
    return problems
