"""What the repository's ``dvc.yaml`` declares as stage outputs, so that a command pointed at other
data does not overwrite them.

``agent-gspo prepare --out OTHER`` (and ``validate --data OTHER``) write the validation report to
``data.report_dir/validation.md``, as documented; with the defaults that is ``reports/validation.md``,
the ``validate`` stage's output, which describes ``data/``. A report of OTHER there replaced it
silently, and ``dvc status`` then called the stage changed. Such a write is refused instead, naming
the option that moves the report (:func:`check_report_target`).

Read with PyYAML rather than DVC's API: importing DVC costs seconds at every CLI start, and only
the ``outs`` / ``metrics`` / ``plots`` paths of each stage (relative to its ``wdir``) are needed.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from components.errors import UserError

OUTPUT_KEYS = ("outs", "metrics", "plots")


def _paths(entries: Iterable[Any]) -> Iterable[str]:
    for e in entries:
        if isinstance(e, str):
            yield e
        elif isinstance(e, dict):
            yield from (k for k in e if isinstance(k, str))


def tracked_outputs(root: str | Path = ".") -> set[Path]:
    """Resolved paths of every stage output in ``root/dvc.yaml`` (empty without a readable one: a
    missing or broken pipeline file protects nothing, and DVC itself reports it)."""
    dvc_yaml = Path(root) / "dvc.yaml"
    try:
        doc = yaml.safe_load(dvc_yaml.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return set()
    stages = doc.get("stages") if isinstance(doc, dict) else None
    out: set[Path] = set()
    for stage in (stages or {}).values():
        if not isinstance(stage, dict):
            continue
        wdir = Path(root) / str(stage.get("wdir", "."))
        for key in OUTPUT_KEYS:
            entries = stage.get(key)
            if isinstance(entries, list):
                out.update((wdir / p).resolve() for p in _paths(entries))
    return out


def check_report_target(report: str | Path, data_dir: str | Path, configured_data: str | Path,
                        root: str | Path = ".") -> None:
    """:class:`UserError` when a validation report of ``data_dir`` would replace a DVC-tracked report of
    another data folder (``configured_data``, ``data.out_dir``); nothing is written before this check."""
    if Path(data_dir).resolve() == Path(configured_data).resolve():
        return
    if Path(report).resolve() in tracked_outputs(root):
        raise UserError(f"data.report_dir {Path(report).parent}: {report} is the validation report of data.out_dir "
                        f"({configured_data}), an output that dvc.yaml tracks; a report of {data_dir} would replace "
                        "it. Give its report another folder with --set data.report_dir=FOLDER (nothing was written)")
