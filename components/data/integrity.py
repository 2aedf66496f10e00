"""Reading a prepared file only as ``prepare`` wrote it: content hash, UTF-8 and size checks.

Every step that reads prepared data (evaluate, train, rollout, search, experiments, score: all
through :func:`components.data.prepare.load_split`; ``validate`` through
:func:`components.data.expectations.validate`) opens a parquet file with :func:`read_checked`:

1. its bytes must hash to the sha256 that ``data/manifest.json`` records for it
   (``benchmarks.<name>.output_sha256["<name>/<split>.parquet"]``, written by ``prepare``); the
   bytes parsed are the bytes hashed (:func:`components.io.read_matching`, hashed once per file and
   process). So the manifest's own sha256, the data version recorded on runs, results and model
   versions (``data.manifest_sha256``, ``data_manifest_sha256``), describes what was read. A mismatch
   is a :class:`DataIntegrityError`: one line naming the file, both hash prefixes and the fix.
2. every string cell must be UTF-8 (:func:`check_utf8`): a bad one names the file, row and column.
3. (``load_split`` only) questions, choices and answers must fit ``data.max_*_chars``
   (:func:`oversize`), checked on the columns before any item is built or tokenised.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from components.config_sections import DataConfig
from components.data.outputs import unreadable_prepared
from components.data.spec import DataError, DataValidationError
from components.io import read_matching

MANIFEST = "manifest.json"
SHOWN_HEX = 12
"""hash prefix shown in messages"""


class DataIntegrityError(DataError):
    """A prepared file is not what the manifest records (changed after ``prepare``, or no hash recorded)."""


class TamperedDataError(DataIntegrityError, DataValidationError):
    """``validate``'s refusal of changed files: the one line of the first, and (as every failed
    validation) the report, which the Prefect flow posts as its artifact."""


@dataclass(frozen=True)
class TextLimits:
    """``data.max_question_chars`` / ``max_choice_chars`` / ``max_answer_chars`` (characters)."""

    question: int
    choice: int
    answer: int

    @classmethod
    def of(cls, data: DataConfig | TextLimits | None = None) -> TextLimits:
        """The limits of a ``DataConfig`` (None: the schema's defaults; a TextLimits: itself)."""
        if isinstance(data, TextLimits):
            return data
        if data is None:
            data = DataConfig()
        return cls(data.max_question_chars, data.max_choice_chars, data.max_answer_chars)


def _fix(benchmark: str) -> str:
    return f"re-run `agent-gspo prepare --benchmarks {benchmark}`"


def recorded_sha256(data_dir: str | os.PathLike[str], benchmark: str, split: str) -> str:
    """The sha256 the manifest records for ``<benchmark>/<split>.parquet``; DataIntegrityError when
    there is no manifest, no entry, or an older manifest without per-file content hashes."""
    manifest = Path(data_dir) / MANIFEST
    rel = f"{benchmark}/{split}.parquet"
    if not manifest.is_file():
        raise DataIntegrityError(f"{manifest}: not found, so {Path(data_dir) / rel} cannot be checked against the "
                                 f"sha256 prepare recorded; {_fix(benchmark)}")
    try:
        doc = json.loads(manifest.read_bytes().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataIntegrityError(f"{manifest}: corrupt manifest ({type(exc).__name__}); {_fix(benchmark)}") from None
    entries = doc.get("benchmarks") if isinstance(doc, dict) else None
    entry = entries.get(benchmark) if isinstance(entries, dict) else None
    if not isinstance(entry, dict):
        raise DataIntegrityError(f"{manifest}: records no entry for {benchmark} (its files were not written by this "
                                 f"prepare); {_fix(benchmark)}")
    hashes = entry.get("output_sha256")
    sha = hashes.get(rel) if isinstance(hashes, dict) else None
    if not isinstance(sha, str) or len(sha) != 64:
        raise DataIntegrityError(f"{manifest}: records no content sha256 for {rel} (a manifest from an older "
                                 f"prepare); {_fix(benchmark)}")
    return sha.lower()


def read_checked(data_dir: str | os.PathLike[str], benchmark: str, split: str) -> pa.Table:
    """The table of ``data_dir/<benchmark>/<split>.parquet``, read only when its bytes hash to the
    manifest's sha256 and every string cell is UTF-8 (see the module docstring)."""
    path = Path(data_dir) / benchmark / f"{split}.parquet"
    expected = recorded_sha256(data_dir, benchmark, split)
    try:
        data, actual = read_matching(path, expected)
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc}); {_fix(benchmark)}") from None
    if actual != expected:
        raise DataIntegrityError(
            f"{path}: content sha256 {actual[:SHOWN_HEX]}... differs from the {expected[:SHOWN_HEX]}... that "
            f"{Path(data_dir) / MANIFEST} records: the file changed after prepare wrote it; {_fix(benchmark)}")
    try:
        # one thread: a split is at most a few MB, and arrow's worker pool, started for the decode, can
        # still be tearing down at interpreter exit; under load that was seen once in CI as SIGABRT
        # ("terminate called without an active exception") after `score` had printed its exit-2 error
        table = pq.read_table(pa.BufferReader(data), use_threads=False)
    except (pa.ArrowException, OSError) as exc:
        raise unreadable_prepared(path, benchmark, exc) from None
    check_utf8(table, path)
    return table


def _bad_utf8_row(column: pa.ChunkedArray) -> int | None:
    """Row of the first string cell that is not UTF-8 (None: all are). Only a chunk that fails
    arrow's full validation is decoded cell by cell."""
    row = 0
    for chunk in column.chunks:
        try:
            chunk.validate(full=True)
        except pa.ArrowInvalid:
            if pa.types.is_list(chunk.type):
                rows = pc.list_parent_indices(chunk).to_pylist()
                cells = pc.list_flatten(chunk).view(pa.binary()).to_pylist()
            else:
                cells = chunk.view(pa.binary()).to_pylist()
                rows = list(range(len(cells)))
            for k, value in zip(rows, cells, strict=True):
                if _not_utf8(value):
                    return row + k
        row += len(chunk)
    return None


def _not_utf8(value: bytes | None) -> bool:
    if value is None:
        return False
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def check_utf8(table: pa.Table, path: Path) -> None:
    """DataError naming file, row (and its id) and column for the first string cell that is not UTF-8."""
    for name in table.column_names:
        column = table.column(name)
        kind = column.type.value_type if pa.types.is_list(column.type) else column.type
        if not pa.types.is_string(kind):
            continue
        row = _bad_utf8_row(column)
        if row is not None:
            rid = _row_id(table, row)
            raise DataError(f"{path}: row {row}{rid}: column {name!r} is not UTF-8; the file was not written by "
                            f"prepare: re-run `agent-gspo prepare --benchmarks {path.parent.name}`")


def _row_id(table: pa.Table, row: int) -> str:
    """`` (id <id>)`` of ``row`` (its bytes decoded leniently: the id itself may be the bad cell)."""
    column = table.column("id") if "id" in table.column_names else None
    if column is None or not pa.types.is_string(column.type):
        return ""
    value = column.slice(row, 1).combine_chunks().view(pa.binary())[0].as_py()
    return f" (id {value.decode('utf-8', 'replace')})" if value is not None else ""


def _lengths(table: pa.Table, name: str) -> pa.Array | None:
    """Characters per row of string column ``name``; a list column: its longest element's."""
    if name not in table.column_names:
        return None
    column = table.column(name).combine_chunks()
    if pa.types.is_list(column.type):
        parent = pc.list_parent_indices(column)
        longest = [0] * len(column)
        for row, n in zip(parent.to_pylist(), pc.utf8_length(pc.list_flatten(column)).to_pylist(), strict=True):
            longest[row] = max(longest[row], n or 0)
        return pa.array(longest, pa.int64())
    if not pa.types.is_string(column.type):
        return None
    return pc.fill_null(pc.utf8_length(column), 0)


FIELDS = (("question", "question", "max_question_chars"), ("choices", "choice", "max_choice_chars"),
          ("answer", "answer", "max_answer_chars"))
"""(column, :class:`TextLimits` field, config key)"""


def oversize(table: pa.Table, limits: TextLimits) -> list[tuple[int, str, int, int, str]]:
    """(row, column, characters, limit, config key) of each cell above its limit (first row per column)."""
    found = []
    for column, attr, key in FIELDS:
        lengths = _lengths(table, column)
        limit = getattr(limits, attr)
        if lengths is None or len(lengths) == 0 or pc.max(lengths).as_py() <= limit:
            continue
        row = pc.index(pc.greater(lengths, limit), True).as_py()
        found.append((row, column, lengths[row].as_py(), limit, key))
    return found


def check_sizes(table: pa.Table, path: Path, limits: TextLimits) -> None:
    """DataError naming file, row, id and field for the first cell above its ``data.max_*_chars``."""
    for row, column, n, limit, key in oversize(table, limits):
        what = "an option of 'choices'" if column == "choices" else repr(column)
        raise DataError(f"{path}: row {row}{_row_id(table, row)}: {what} has {n} characters, above "
                        f"data.{key}={limit}; `agent-gspo validate` refuses it too: fix the source and re-run prepare")
