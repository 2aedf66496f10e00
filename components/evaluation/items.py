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

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.data.item import Item
from components.data.prepare import load_split
from components.io import check_output_file, write_text_atomic
from components.items_file import (  # noqa: F401  (re-exported: the record's format lives below tracking)
    FIELDS,
    ITEMS_ARTIFACT,
    ITEMS_FILE,
    ITEMS_PARAM,
    MAIN_PARAM,
    ItemsFileError,
    decode,
    encode,
    headline,
    items_sha256,
    read_items,
    scores,
)
from components.scoring.grader import grade_many

if TYPE_CHECKING:
    from components.evaluation.metrics import EpisodeStats
    from components.mas.records import Episode
    from components.tracking.mlflow_logging import Tracker


def item_record(system: str, benchmark: str, item: Item, episode: Episode | EpisodeStats) -> dict[str, Any]:
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


def regrade(records: Sequence[Mapping[str, Any]], items: Mapping[tuple[str, str], Item], *, where: str,
            timeout_s: float = 10.0) -> dict[str, Any]:
    """Grade every record's prediction again with the one grader and compare with what it records.

    ``items`` maps ``(benchmark, id)`` to the prepared item. Returns a summary (n, agreeing,
    disagreeing rows with both values) and ``grades`` (one per record, in order)."""
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


def log_items_table(tracker: Tracker, path: Path) -> None:
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
