"""What a ``--resume`` checks before a checkpoint's state is applied.

* The trainer state a checkpoint holds (``extra.json`` / ``extra.pkl``: step, data cursor, dual
  controller, history, config hash, unsent metrics) must have its keys, of their types, and the
  step of ``meta.json`` and of the folder's name: a hand-edited or foreign file is one error naming
  it (:func:`components.runtime.checkpoint.incompatible`), not a ``KeyError`` deep in the trainer.
* The config must be the one the checkpoint was trained under, but only in what can change the
  trained weights. :func:`resume_hash` is the config hash (:meth:`Config.hash`, which tags runs,
  model versions and results, and is left as it is) without the settings that cannot: tracking,
  evaluation, registry and search settings, checkpoint retention and cadence, and the output
  folder. Fewer checkpoints kept after a full disk, a moved run folder, an edited ``eval`` section
  between a crash and the flow's retry: all resume.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.config import Config
from components.errors import UserError
from components.reward.budget import BudgetError
from components.runtime.checkpoint import applying, extra_file, incompatible, read_extra, read_meta

if TYPE_CHECKING:  # the trainer loads the rollout engine; checking a checkpoint needs none of it
    from components.gspo.trainer import GSPOTrainer

RESUME_FREE_SECTIONS = ("tracking", "eval", "registry", "search", "experiments")
"""config sections a run resumes across (``experiments`` is not in :meth:`Config.hash` either)"""
RESUME_FREE_KEYS = ("gspo.keep_checkpoints", "gspo.checkpoint_every", "gspo.out_dir")
"""single settings a run resumes across"""


def _free(key: str) -> bool:
    return key.split(".", 1)[0] in RESUME_FREE_SECTIONS or key in RESUME_FREE_KEYS


def resume_settings(cfg: Config) -> dict[str, Any]:
    """The ``section.key`` settings :func:`resume_hash` covers (URI passwords redacted: these are stored
    in checkpoints to name what changed)."""
    return {k: v for k, v in cfg.flat().items() if not _free(k)}


def resume_hash(cfg: Config) -> str:
    """sha256 of the canonical JSON of the config without the settings a run resumes across."""
    data = cfg.model_dump(mode="json", exclude=set(RESUME_FREE_SECTIONS))
    for key in RESUME_FREE_KEYS:
        section, name = key.split(".", 1)
        data[section].pop(name, None)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def config_fields(cfg: Config) -> dict[str, Any]:
    """What a checkpoint's trainer state records of the config, so a resume can be checked against it
    (:func:`check_resume_config`): the config hash, the resume hash and the settings it covers."""
    return {"config_hash": cfg.hash(), "resume_hash": resume_hash(cfg), "config_settings": resume_settings(cfg)}


def resumable(state: dict[str, Any], cfg: Config) -> bool:
    """May a checkpoint with trainer ``state`` resume under ``cfg``? Checkpoints written before resume
    hashes existed compare the whole config hash, as they did then. When the hashes differ, a
    checkpoint that stored its settings resumes if nothing changed but settings added to the schema
    since it was written, at their defaults (:func:`changed_settings`): a new setting's default
    keeps the old behaviour, so a code update does not strand a half-trained run."""
    if "resume_hash" in state:
        if state["resume_hash"] == resume_hash(cfg):
            return True
        then = state.get("config_settings")
        return isinstance(then, dict) and bool(then) and not changed_settings(then, resume_settings(cfg))
    return state.get("config_hash") == cfg.hash()


def changed_settings(then: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``section.key`` settings that differ between a checkpoint's stored ``then`` and ``now``,
    leaving out the ones a run resumes across and the ones ``then`` lacks that ``now`` holds at the
    schema default (added to the schema after the checkpoint was written)."""
    defaults = resume_settings(Config())
    now = json.loads(json.dumps(now))  # stored settings went through JSON: tuples are lists there
    then = {k: v for k, v in then.items() if not _free(k)}
    return [k for k in sorted(set(then) | set(now)) if then.get(k) != now.get(k)
            and not (k not in then and k in defaults and now.get(k) == defaults[k])]


def check_resume_config(state: dict[str, Any], cfg: Config) -> None:
    """Refuse a checkpoint written under settings that change the trained weights, naming them. A state
    without a config hash (hand-made, or another program's) is refused, never resumed blindly."""
    if not isinstance(state.get("config_hash"), str):
        raise UserError("checkpoint state has no config hash (not written by this trainer, or edited); "
                        "start a fresh --out folder or --overwrite")
    if not resumable(state, cfg):
        raise UserError("checkpoint was written with a different config (config hash differs"
                        + settings_diff(state.get("config_settings"), resume_settings(cfg))
                        + "); resume with the same params/profile or start a fresh --out folder")


def settings_diff(then: Any, now: dict[str, Any]) -> str:
    """``: gspo.lr 2e-05 -> 1e-05, ...`` naming what changed since a checkpoint was written, among the
    settings that matter for a resume (empty for checkpoints written before they recorded them)."""
    if not isinstance(then, dict):
        return ""
    changed = [f"{k} {then.get(k, '<unset>')!r} -> {now.get(k, '<unset>')!r}" for k in changed_settings(then, now)]
    shown = ", ".join(changed[:8]) + (f", ... ({len(changed)} in all)" if len(changed) > 8 else "")
    return f": {shown}" if changed else ""


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _pending_row(row: Any) -> bool:
    return (isinstance(row, list | tuple) and len(row) == 3 and _is_count(row[0]) and _is_count(row[1])
            and isinstance(row[2], dict))


_REQUIRED: dict[str, tuple[str, Any]] = {
    "step": ("a step number", _is_count),
    "cursor": ("a question count", _is_count),
    "controller": ("a mapping", lambda v: isinstance(v, dict)),
    "history": ("a list of metric mappings", lambda v: isinstance(v, list) and all(isinstance(r, dict) for r in v)),
    "config_hash": ("a config hash", lambda v: isinstance(v, str) and len(v) == 64),
}
_OPTIONAL: dict[str, tuple[str, Any]] = {
    "resume_hash": ("a config hash", lambda v: isinstance(v, str) and len(v) == 64),
    "config_settings": ("a mapping", lambda v: isinstance(v, dict)),
    "budget_calibration": ("a mapping or null", lambda v: v is None or isinstance(v, dict)),
    "mlflow_run_id": ("a run id or null", lambda v: v is None or (isinstance(v, str) and v != "")),
    "mlflow_pending": ("a list of [step, time, metrics] rows", lambda v: isinstance(v, list)
                       and all(_pending_row(r) for r in v)),
}


def state_problem(state: dict[str, Any], step: int) -> str | None:
    """What is wrong with a checkpoint's trainer state (None: nothing). ``step`` is its ``meta.json``
    step, which the state's own must equal."""
    missing = [k for k in _REQUIRED if k not in state]
    if missing:
        return f"no {', '.join(missing)}"
    for key, (what, ok) in (_REQUIRED | _OPTIONAL).items():
        if key in state and not ok(state[key]):
            return f"{key} {_short(state[key])} is not {what}"
    if state["step"] != step:
        return f"step {state['step']} but meta.json says {step}"
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_train_state(checkpoint: Path) -> dict[str, Any]:
    """The trainer state of ``checkpoint``, checked (:func:`state_problem`) before anything is applied."""
    state = read_extra(checkpoint)
    problem = state_problem(state, read_meta(checkpoint).step)
    if problem:
        raise incompatible(extra_file(checkpoint), checkpoint, problem)
    return state


def load_train_state(trainer: GSPOTrainer, state: dict[str, Any], checkpoint: Path) -> None:
    """``trainer.load_state(state)``; what it raises on contents that do not fit (the budget
    controller's own checks included) is one error naming the checkpoint's state file."""
    file = extra_file(checkpoint)
    try:
        with applying(file, checkpoint):
            trainer.load_state(state)
    except BudgetError as exc:
        raise incompatible(file, checkpoint, str(exc)) from exc


__all__ = [
    "RESUME_FREE_KEYS", "RESUME_FREE_SECTIONS", "changed_settings", "check_resume_config", "config_fields",
    "load_train_state",
    "read_train_state", "resumable", "resume_hash", "resume_settings", "settings_diff", "state_problem",
]
