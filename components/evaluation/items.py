"""The per-item record of an evaluation: what every system answered on every item, and why it scored.

Aggregates (``summary.json``) say how often a system was right; they cannot be re-graded, paired
with another evaluation, or checked. So every evaluation also writes ``items.jsonl``, one JSON line
per (system, benchmark, item), published with the aggregates as one set
(:mod:`components.evaluation.publish`)::

    system, benchmark, id      which system answered which item
    prediction                 the voted answer text (decoded from the ids the engine produced)
    extracted                  the one grader's ``extract`` of it (None: no answer found)
    gold, correct, grading_error
    tokens                     {prompt, completion, communicated, total}, counted from ids
    silence                    [[agent, round, silent], ...] one per message, in order
    transcript                 [{agent, round, text, silent}, ...] every message

Lines are sorted (system order of the run, benchmark, sample order), so the same evaluation gives
the same bytes and its sha256 (:func:`items_sha256`) identifies it. The evaluation run records that
sha256 as an MLflow PARAM (immutable; tags are not): the promotion gate downloads the file and
refuses it unless the hashes agree (:mod:`components.tracking.evidence`). The file grows with
items x messages (a full MMLU run: a few hundred MB at most), bounded by the evaluation itself.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from components.comparison import ItemScore
from components.data.item import Item
from components.errors import UserError

ITEMS_FILE = "items.jsonl"
ITEMS_PARAM = "eval.items_sha256"
"""evaluation-run param: sha256 of the run's items file"""
MAIN_PARAM = "eval.main_system"
"""evaluation-run param: the system whose rows the gate compares"""
ITEMS_ARTIFACT = f"eval/{ITEMS_FILE}"
"""where the evaluation job logs the file among the run's artifacts"""
FIELDS = ("system", "benchmark", "id", "prediction", "extracted", "gold", "correct", "grading_error", "tokens",
          "silence", "transcript")


class ItemsFileError(UserError):
    """An items file that is not a per-item record (bad JSON, missing field, duplicate item)."""


def item_record(system: str, benchmark: str, item: Item, episode: Any) -> dict[str, Any]:
    """One line of the record from a graded episode (an ``Episode`` or its ``EpisodeStats``)."""
    messages = list(episode.messages)
    return {
        "system": system, "benchmark": benchmark, "id": str(episode.question_id),
        "prediction": episode.final_answer, "extracted": episode.extracted, "gold": item.answer,
        "correct": bool(episode.correct), "grading_error": episode.score_error,
        "tokens": {"prompt": int(episode.prompt_tokens), "completion": int(episode.completion_tokens),
                   "communicated": int(episode.communicated_tokens), "total": int(episode.total_tokens)},
        "silence": [[int(m.agent_id), int(m.round), bool(m.silent)] for m in messages],
        "transcript": [{"agent": int(m.agent_id), "round": int(m.round), "text": getattr(m, "text", ""),
                        "silent": bool(m.silent)} for m in messages],
    }


def records_of(per_system: Mapping[str, Mapping[str, Sequence[Any]]],
               items: Mapping[str, Sequence[Item]]) -> list[dict[str, Any]]:
    """Every system's records, system by system, benchmark by benchmark, in sample order."""
    by_id = {b: {i.id: i for i in its} for b, its in items.items()}
    return [item_record(system, b, by_id[b][ep.question_id], ep)
            for system, benchmarks in per_system.items() for b in items for ep in benchmarks[b]]


def encode(records: Iterable[Mapping[str, Any]]) -> bytes:
    """The file's bytes: one canonical JSON object per line (sorted keys, UTF-8)."""
    return b"".join(json.dumps(r, sort_keys=True, ensure_ascii=False).encode() + b"\n" for r in records)


def items_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def decode(data: bytes, where: str) -> list[dict[str, Any]]:
    """Parse an items file's bytes; :class:`ItemsFileError` names ``where`` and the line."""
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, str, str]] = set()
    # split on "\n" only: str.splitlines() also breaks at U+2028, U+0085, ... which json.dumps leaves
    # unescaped inside strings (a model's text can hold them)
    for n, line in enumerate(data.decode("utf-8", errors="strict").split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ItemsFileError(f"{where}, line {n}: not JSON ({exc.msg})") from None
        missing = [f for f in FIELDS if not isinstance(row, dict) or f not in row]
        if missing:
            raise ItemsFileError(f"{where}, line {n}: missing field(s) {', '.join(missing)} (not a per-item record)")
        key = (str(row["system"]), str(row["benchmark"]), str(row["id"]))
        if key in seen:
            raise ItemsFileError(f"{where}, line {n}: item {key[2]!r} of {key[1]} occurs twice for system {key[0]}")
        seen.add(key)
        out.append(row)
    return out


def read_items(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ItemsFileError(f"items file {path}: {exc.strerror or exc}") from None
    return decode(data, str(path))


def scores(records: Sequence[Mapping[str, Any]], system: str) -> dict[str, list[ItemScore]]:
    """``{benchmark: [ItemScore]}`` of one system (what :func:`components.comparison.paired_verdict` takes)."""
    out: dict[str, list[ItemScore]] = {}
    for r in records:
        if r["system"] == system:
            out.setdefault(str(r["benchmark"]), []).append(
                ItemScore(str(r["id"]), bool(r["correct"]), float(r["tokens"]["total"])))
    return out


def headline(by_benchmark: Mapping[str, Sequence[ItemScore]]) -> tuple[float, float, int]:
    """``(macro accuracy, total tokens, items)`` as :func:`components.evaluation.metrics.summarise`
    computes them from the aggregates: the numbers an evaluation writes on a registry version."""
    groups = [v for v in by_benchmark.values() if v]
    if not groups:
        return 0.0, 0.0, 0
    acc = sum(statistics.fmean(float(s.correct) for s in v) for v in groups) / len(groups)
    return acc, float(sum(s.tokens_total for v in groups for s in v)), sum(len(v) for v in groups)


def regrade(records: Sequence[Mapping[str, Any]], items: Mapping[tuple[str, str], Item], *, where: str,
            timeout_s: float = 10.0) -> dict[str, Any]:
    """Grade every record's prediction again with the one grader and compare with what it records.

    ``items`` maps ``(benchmark, id)`` to the prepared item. Returns a summary (n, agreeing,
    disagreeing rows with both values) and ``grades`` (one per record, in order)."""
    from components.scoring.grader import grade_many

    missing = [(r["benchmark"], r["id"]) for r in records if (r["benchmark"], r["id"]) not in items]
    if missing:
        raise ItemsFileError(f"{where}: {len(missing)} item(s) not in the prepared data, e.g. {missing[0][1]!r} "
                             f"of {missing[0][0]} (prepare the same data, or pass --data)")
    results = grade_many([(items[(r["benchmark"], r["id"])], r["prediction"] or "") for r in records],
                         timeout_s=timeout_s)
    grades, differ = [], []
    for n, (r, res) in enumerate(zip(records, results, strict=True), 1):
        grades.append({"system": r["system"], "benchmark": r["benchmark"], "id": r["id"], "correct": res.correct,
                       "extracted": res.extracted, "recorded_correct": bool(r["correct"]), "error": res.error})
        if bool(res.correct) != bool(r["correct"]):
            differ.append({"line": n, "system": r["system"], "benchmark": r["benchmark"], "id": r["id"],
                           "recorded": bool(r["correct"]), "regraded": bool(res.correct)})
    return {"items_file": where, "n": len(records), "agree": len(records) - len(differ), "disagree": len(differ),
            "disagreements": differ[:20], "grades": grades}


def log_items_table(tracker: Any, path: Path) -> None:
    """The per-item record as an MLflow evaluation table (``eval_items.json``; the transcript and the
    silence list as JSON string columns), for the run's Evaluation view."""
    from components.tracking.backend import guarded

    rows = read_items(path)
    table = {k: [r[k] for r in rows] for k in ("system", "benchmark", "id", "prediction", "extracted", "gold",
                                                 "correct")}
    for kind in ("prompt", "completion", "communicated", "total"):
        table[f"tokens_{kind}"] = [r["tokens"][kind] for r in rows]
    table["silence"] = [json.dumps(r["silence"]) for r in rows]
    table["transcript"] = [json.dumps(r["transcript"], ensure_ascii=False) for r in rows]
    client, run_id = tracker.client, tracker.run_id
    guarded(tracker.uri, "log the per-item table", lambda: client.log_table(run_id, table, "eval_items.json"))


def regrade_file(path: str | Path, data_dir: str | Path, *, split: str = "test", out: str | Path | None = None,
                 timeout_s: float = 10.0) -> dict[str, Any]:
    """``agent-gspo score --items``: re-grade an items file against the prepared data under
    ``data_dir``, write the grades (JSON lines) to ``out`` when given, and raise
    :class:`ItemsFileError` naming the first line whose grade differs from the recorded ``correct``.
    Returns the summary without the per-record grades."""
    from components.data.prepare import load_split
    from components.io import check_output_file, write_text_atomic

    if out is not None:  # refused before grading (a pipeline input, a folder, an unwritable place)
        check_output_file(out, "per-item results (--out)")
    records = read_items(path)
    benchmarks = sorted({str(r["benchmark"]) for r in records})
    items = {(b, i.id): i for b in benchmarks for i in load_split(Path(data_dir), b, split)}
    summary = regrade(records, items, where=str(path), timeout_s=timeout_s)
    grades = summary.pop("grades")
    if out is not None:
        write_text_atomic(out, "".join(json.dumps(g, sort_keys=True) + "\n" for g in grades))
        summary["out"] = str(out)
    if summary["disagree"]:
        d = summary["disagreements"][0]
        raise ItemsFileError(f"{path}, line {d['line']}: item {d['id']!r} of {d['benchmark']} ({d['system']}) records "
                             f"correct={d['recorded']} but re-grades to {d['regraded']} ({summary['disagree']} of "
                             f"{summary['n']} records disagree)")
    return summary
