"""Prepare benchmarks: load -> normalise -> validate (GX) -> atomic parquet -> manifest.

Layout written under ``out_dir``::

    <benchmark>/<split>.parquet   one normalised record per row (spec.RECORD_COLUMNS)
    manifest.json                 per benchmark: source, rows, expected rows, sha256 in/out; totals

All or nothing: every requested benchmark is read and validated *before* anything is written (two
phases: :func:`check_benchmark` for all, then the write phase of :mod:`components.data.outputs`),
and the write phase stages every benchmark's files first, then swaps all the folders in and only
then the manifest. So a malformed input, a failed suite, or a refused write (full disk, read-only
file system) in any benchmark leaves the previously prepared files and the manifest byte-identical.
A failed suite writes the markdown report to ``report_path`` when one is given. What can be refused
without reading data is checked first (:func:`components.data.outputs.check_prepare`: output and
report folders writable, not the mirror, the existing manifest readable, no repeated benchmark).
The manifest holds no timestamps, so preparing the same inputs twice gives the same bytes (DVC-friendly).

Concurrent prepares into one folder are safe: the write phase holds each benchmark's
``.<name>.lock`` and the manifest's ``.manifest.lock`` (``flock``: freed when a holder dies). Under
those locks a writer first clears what a killed prepare left (``.<name>.*.staging``, an
interrupted swap's ``.<name>.old-*``, which is put back when the folder is missing), so no
leftover ever trips a later prepare.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from components.config_sections import DataConfig
from components.data.adapters import Record
from components.data.integrity import TextLimits, check_sizes, read_checked
from components.data.item import Item
from components.data.outputs import (  # noqa: F401  (MANIFEST, BenchmarkResult, manifest_sha256: re-exported)
    MANIFEST,
    BenchmarkResult,
    CheckedBenchmark,
    StagedBenchmark,
    check_prepare,
    commit,
    manifest_sha256,
    stage_benchmark,
    write_locks,
)
from components.data.sources import load_benchmark, resolve_mirror
from components.data.spec import BENCHMARK_NAMES, DataError, DataValidationError, get_spec
from components.errors import UserError
from components.io import file_lock, recover_leftovers, write_text_atomic
from components.progress import report

PARQUET_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("benchmark", pa.string()),
        ("split", pa.string()),
        ("question", pa.string()),
        ("choices", pa.list_(pa.string())),
        ("answer", pa.string()),
        ("answer_type", pa.string()),
        ("meta", pa.string()),
    ]
)


@dataclass
class PrepareReport:
    """Outcome of :func:`prepare` over several benchmarks."""

    results: list[BenchmarkResult]
    manifest_path: Path
    seconds: float
    manifest: dict[str, Any]


def records_to_table(records: list[Record]) -> pa.Table:
    """Records (meta as dict) -> arrow table with ``meta`` JSON-encoded (sorted keys, UTF-8)."""
    rows = [{**r, "meta": json.dumps(r["meta"], ensure_ascii=False, sort_keys=True)} for r in records]
    return pa.Table.from_pylist(rows, schema=PARQUET_SCHEMA)


def check_benchmark(
    name: str, *, mirror: str | os.PathLike[str] | None, use_hub: bool = True,
    limits: DataConfig | TextLimits | None = None,
) -> CheckedBenchmark:
    """Load, normalise and run the suites of one benchmark; writes nothing.

    ``limits``: the ``data.max_*_chars`` sizes (a ``DataConfig`` or :class:`TextLimits`; None: defaults).
    Raises ``DataSourceError`` (no source) or ``DataError`` (malformed input); a failed suite is
    returned (``ok`` False), not raised, so a caller can report every benchmark's failures at once.
    """
    t0 = time.perf_counter()
    spec = get_spec(name)
    loaded = load_benchmark(name, mirror=resolve_mirror(mirror), use_hub=use_hub)
    unknown = sorted(set(loaded.splits) - set(spec.expected))
    if unknown:
        raise DataError(f"{name}: source {loaded.source} produced unexpected split(s) {unknown}")
    tables = {split: records_to_table(loaded.splits.get(split, [])) for split in spec.expected}
    from components.data.expectations import validate_frame  # GX import is slow: only here

    suites = [validate_frame(name, split, t.to_pandas(), TextLimits.of(limits)) for split, t in tables.items()]
    return CheckedBenchmark(name, loaded.source, tables, loaded.input_sha256, suites,
                            time.perf_counter() - t0)


def validation_failure(
    checked: list[CheckedBenchmark], out_dir: str | os.PathLike[str], report_path: str | os.PathLike[str] | None
) -> DataValidationError:
    """The error for failed suites; writes the markdown report (every checked suite) to ``report_path``."""
    from components.data.expectations import render_report

    report = render_report([r for c in checked for r in c.suites])
    failed = [c for c in checked if not c.ok]
    where = ""
    if report_path is not None:
        write_text_atomic(report_path, report)
        where = f"; report: {report_path}"
    # prepare() and the Prefect flow write nothing when any benchmark fails (all or nothing)
    return DataValidationError(
        f"{', '.join(c.name for c in failed)}: great-expectations validation failed (source "
        f"{', '.join(sorted({c.source for c in failed}))}); nothing was written to {out_dir}{where}\n{report}",
        report,
    )


def prepare_benchmark(
    name: str,
    *,
    mirror: str | os.PathLike[str] | None,
    out_dir: str | os.PathLike[str],
    use_hub: bool = True,
    report_path: str | os.PathLike[str] | None = None,
) -> BenchmarkResult:
    """Load, normalise, validate and atomically write one benchmark to ``out_dir/<name>/`` (and its
    manifest entry).

    ``mirror`` None falls back to ``$AGENT_GSPO_DATA_MIRROR`` (config resolution is the
    caller's: use :func:`components.data.sources.resolve_mirror`). Raises ``DataSourceError``
    (no source), ``DataError`` (malformed input), ``DataValidationError`` (suite failed,
    with the markdown report, also written to ``report_path``) or ``DataWriteError``; in every
    case ``out_dir`` is untouched.
    """
    return prepare([name], mirror=mirror, out_dir=out_dir, data=DataConfig(use_hub=use_hub), progress=False,
                   report_path=report_path).results[0]


@contextlib.contextmanager
def _progress(enabled: bool, total: int) -> Iterator[Callable[[str], None]]:
    """Progress over ``total`` steps (:mod:`components.progress`: throttled lines through logging);
    the yielded ``step(label)`` starts the next one."""
    if not enabled:
        yield lambda _label: None
        return
    with report("prepare", total, "steps") as progress:
        started = [False]

        def step(label: str) -> None:
            progress.advance(1 if started[0] else 0, detail=f"now: {label}")
            started[0] = True

        yield step


def prepare(
    benchmarks: list[str],
    *,
    mirror: str | os.PathLike[str] | None,
    out_dir: str | os.PathLike[str],
    data: DataConfig | None = None,
    progress: bool = True,
    report_path: str | os.PathLike[str] | None = None,
) -> PrepareReport:
    """Check every benchmark, then (only if all pass) write them all and the manifest.

    All or nothing: a malformed input or a failed suite in any benchmark raises before anything is
    written (the suites of all benchmarks are run, and their report goes to ``report_path``); a
    refused write (``DataWriteError``, naming the file) happens while staging, before any folder
    or the manifest is replaced (see :mod:`components.data.outputs`). ``data``: the ``data`` section
    whose ``use_hub`` and text limits apply (None: the schema's defaults), as in :func:`check_benchmark`.
    """
    data = data or DataConfig()
    check_prepare(benchmarks, out_dir, report_path, resolve_mirror(mirror))
    recover_interrupted(out_dir)
    t0 = time.perf_counter()
    checked: list[CheckedBenchmark] = []
    staged: list[StagedBenchmark] = []
    with _progress(progress, 2 * len(benchmarks)) as step:
        for name in benchmarks:
            step(f"check {name}")
            try:
                checked.append(check_benchmark(name, mirror=mirror, use_hub=data.use_hub, limits=data))
            except UserError:
                if not all(c.ok for c in checked):  # earlier suites failed: still report them
                    validation_failure(checked, out_dir, report_path)
                raise
        if not all(c.ok for c in checked):
            raise validation_failure(checked, out_dir, report_path)
        with write_locks(out_dir, benchmarks):
            for c in checked:
                step(f"write {c.name}")
                staged.append(stage_benchmark(c, out_dir))
            manifest = commit(staged, out_dir)
    return PrepareReport([s.result for s in staged], Path(out_dir) / MANIFEST, round(time.perf_counter() - t0, 3),
                         manifest)


def recover_interrupted(out_dir: str | os.PathLike[str]) -> list[str]:
    """Clear the leftovers of killed prepares for every benchmark in ``out_dir`` (each under its lock)."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    names = {entry.name[1:].split(".", 1)[0] for entry in out_dir.iterdir() if entry.name.startswith(".")}
    done: list[str] = []
    for name in sorted(names & set(BENCHMARK_NAMES)):
        with file_lock(out_dir / f".{name}.lock"):
            done += recover_leftovers(out_dir / name)
    return done


def load_split(data_dir: str | os.PathLike[str], benchmark: str, split: str,
               limits: TextLimits | Any = None) -> list[Item]:
    """Typed items of one prepared split (``meta`` decoded once, here).

    The file is read only when it is what the manifest records (sha256), UTF-8 throughout, and
    every question, choice and answer fits ``limits`` (the ``data.max_*_chars`` of a ``DataConfig``
    or a :class:`TextLimits`; None: the schema's defaults), all checked before an item is built
    (:mod:`components.data.integrity`)."""
    spec = get_spec(benchmark)
    path = Path(data_dir) / benchmark / f"{split}.parquet"
    if split not in spec.expected:
        raise DataError(f"{benchmark}: unknown split {split!r} (splits: {', '.join(spec.expected)})")
    if not path.is_file():
        raise DataError(f"{path}: not found; run `agent-gspo prepare --benchmarks {benchmark}` first")
    table = read_checked(data_dir, benchmark, split)
    check_sizes(table, path, TextLimits.of(limits))
    return [Item.from_record(row, f"{path} row {k}") for k, row in enumerate(table.to_pylist())]


def load_manifest(data_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest written by :func:`components.data.outputs.commit`."""
    path = Path(data_dir) / MANIFEST
    if not path.is_file():
        raise DataError(f"{path}: not found; run `agent-gspo prepare` first")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
