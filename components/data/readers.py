"""Raw file readers for the mirror formats (JSON Lines, gzip JSON Lines, JSON arrays, MMLU CSV).

Each reader turns low-level failures (bad JSON, truncated gzip, bad UTF-8, wrong CSV width)
into a :class:`DataError` naming benchmark, file and line/row, instead of letting a bare
``EOFError`` or ``JSONDecodeError`` escape from deep inside the standard library.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from components.data.spec import DataError


def read_jsonl(path: Path, benchmark: str, gz: bool = False) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_no, obj)`` (1-based) from JSON Lines, optionally gzip-compressed.

    Blank lines are skipped. Truncated/corrupt gzip becomes a DataError naming the last line read,
    instead of a bare ``EOFError`` from deep inside gzip; a line that is not UTF-8 one naming that
    line (each line is decoded on its own: a text-mode reader decodes ahead in blocks, and named a
    line up to a block before the bad byte).
    """
    line_no = 0
    try:
        fh = gzip.open(path, "rb") if gz else open(path, "rb")
        with fh:
            for line_no, raw in enumerate(fh, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise DataError(f"{benchmark}: {path}:{line_no}: not UTF-8 ({exc.reason} at byte "
                                    f"{exc.start} of the line)") from None
                if not line.strip():
                    continue
                try:
                    yield line_no, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(
                        f"{benchmark}: {path}:{line_no}: invalid JSON ({exc.msg} at column {exc.colno})"
                    ) from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise DataError(
            f"{benchmark}: {path}: corrupt or truncated gzip after line {line_no} ({exc})"
        ) from None


def read_json_array(path: Path, benchmark: str) -> list[Any]:
    """Load a file holding one JSON array (MultiArith, SVAMP); a byte that is not UTF-8 is named by line."""
    raw = path.read_bytes()
    try:
        data = json.loads(raw.decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(
            f"{benchmark}: {path}:{exc.lineno}: invalid JSON ({exc.msg} at column {exc.colno})"
        ) from None
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DataError(f"{benchmark}: {path}:{line}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if not isinstance(data, list):
        raise DataError(f"{benchmark}: {path}: expected a JSON array, got {type(data).__name__}")
    return data


def read_mmlu_csv(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(row_no, row)`` from a header-less MMLU CSV (csv module: fields hold newlines).

    The file (at most a few hundred kB) is decoded whole first, so a byte that is not UTF-8 is
    reported with its exact line instead of a ``UnicodeDecodeError`` from inside the csv reader.
    """
    subject = path.name.rsplit("_", 1)[0]
    raw = path.read_bytes()
    if raw.startswith(b"\xef\xbb\xbf"):  # refused, as a JSON file's BOM is (json: "Unexpected UTF-8 BOM")
        raise DataError(f"mmlu: {path}:1: starts with a UTF-8 BOM (byte-order mark); the mirror's CSV files "
                        "are UTF-8 without one: remove it (or restore the original file)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DataError(f"mmlu: {path}:{line}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    with io.StringIO(text, newline="") as fh:
        reader = csv.reader(fh)
        try:
            for row_no, cells in enumerate(reader, start=1):
                if len(cells) != 6:
                    raise DataError(
                        f"mmlu: {path}: row {row_no} (line {reader.line_num}) has "
                        f"{len(cells)} columns, expected 6 (question, A, B, C, D, answer)"
                    )
                yield (
                    row_no,
                    {"question": cells[0], "choices": cells[1:5], "answer": cells[5], "subject": subject},
                )
        except csv.Error as exc:
            raise DataError(f"mmlu: {path}: line {reader.line_num}: {exc}") from None
