"""Synthetic prepared data as ``prepare`` writes it: parquet files and a manifest recording their sha256
(every reader checks a prepared file against the manifest, components/data/integrity.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def record_in_manifest(data_dir: Path, benchmark: str, split: str) -> None:
    """Record ``<benchmark>/<split>.parquet``'s current sha256 in ``data_dir/manifest.json`` (kept entries)."""
    manifest = data_dir / "manifest.json"
    doc: dict[str, Any] = {"format": 1, "benchmarks": {}}
    if manifest.is_file():
        loaded = json.loads(manifest.read_text())
        if isinstance(loaded, dict) and isinstance(loaded.get("benchmarks"), dict):
            doc = loaded
    rel = f"{benchmark}/{split}.parquet"
    entry = doc["benchmarks"].setdefault(benchmark, {})
    entry.setdefault("output_sha256", {})[rel] = hashlib.sha256((data_dir / rel).read_bytes()).hexdigest()
    manifest.write_text(json.dumps(doc, indent=2, sort_keys=True))


def write_prepared(data_dir: Path, benchmark: str, split: str, table: pa.Table | list[dict[str, Any]]) -> Path:
    """Write ``table`` (or rows) as ``data_dir/<benchmark>/<split>.parquet`` and record it in the manifest."""
    path = data_dir / benchmark / f"{split}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table if isinstance(table, pa.Table) else pa.Table.from_pylist(table), path)
    record_in_manifest(data_dir, benchmark, split)
    return path
