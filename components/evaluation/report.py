"""Rendering and writing evaluation results: DVC metrics JSON, summary JSON and the markdown report.

Layout under ``out_dir`` (every file written atomically, so DVC never reads a half-written metric; an
evaluation publishes them as one set, see :mod:`components.evaluation.publish`):

    <benchmark>.json            {system: {accuracy, accuracy_se, n, tokens_*, ...}} (DVC metrics)
    summary.json                {"systems": per-system aggregates, "rows": [...], "meta": {...}}
    report.md                   paper-shaped tables (rows = systems, columns = benchmarks)
    accuracy_vs_tokens.png      see :mod:`components.evaluation.plots`
    silence_by_agent_round.png
    items.jsonl                 the per-item record (components/evaluation/items.py), linked from report.md
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from components.evaluation.metrics import EvalRow
from components.io import write_json_atomic, write_text_atomic
from components.machine import describe

DVC_KEYS = ("n", "correct", "accuracy", "accuracy_se", "tokens_prompt", "tokens_completion", "tokens_communicated",
            "tokens_total", "tokens_prompt_mean", "tokens_completion_mean", "tokens_communicated_mean",
            "tokens_total_mean", "tokens_per_correct", "turns", "messages", "silence_rate", "grading_errors",
            "calls_skipped", "cap_hit_rate")


def fmt_tokens(x: float | None) -> str:
    """Compact token count: 512, 12.3k, 7.2M; '-' for None."""
    if x is None:
        return "-"
    if abs(x) >= 1e6:
        return f"{x / 1e6:.1f}M"
    if abs(x) >= 1e4:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


def _order(rows: Sequence[EvalRow]) -> tuple[list[str], list[str]]:
    systems = list(dict.fromkeys(r.system for r in rows))
    benchmarks = list(dict.fromkeys(r.benchmark for r in rows))
    return systems, benchmarks


def _table(rows: Sequence[EvalRow], cell) -> list[str]:
    systems, benchmarks = _order(rows)
    by = {(r.system, r.benchmark): r for r in rows}
    lines = ["| System | " + " | ".join(benchmarks) + " |", "|---|" + "---|" * len(benchmarks)]
    for s in systems:
        cells = [cell(by[(s, b)]) if (s, b) in by else "-" for b in benchmarks]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return lines


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def render_markdown(rows: Sequence[EvalRow], summary: Mapping[str, Mapping[str, Any]],
                    meta: Mapping[str, Any]) -> str:
    """The report: provenance, accuracy/token table, tokens-per-correct table, behaviour tables."""
    out = ["# Evaluation report", ""]
    for key in ("model", "model_uri", "model_path", "base_model", "data_manifest_sha256", "config_hash", "seed",
                "limit", "batch_size", "self_consistency_k", "decoding", "device"):
        if key in meta:
            out.append(f"- **{key}**: `{meta[key]}`")
    if meta.get("devset"):  # test evaluations' reports stay as they were
        dev = meta["devset"]
        out.append(f"- **split**: `{meta['split']}` (dev items outside the test sample of eval.limit "
                   f"{dev['test_limit']}: " + ", ".join(f"{d['source']} {d['n']} of {d['pool']}"
                                                       for d in dev["benchmarks"].values()) + ")")
    if "machine" in meta:
        out.append(f"- **machine**: {describe(meta['machine'])}")
    if meta.get("items_sha256"):
        out.append(f"- **per-item record**: [items.jsonl](items.jsonl) (prediction, extracted answer, gold, tokens, "
                   f"silence and transcript of every item; sha256 `{meta['items_sha256']}`)")
    out += ["", "## Accuracy and token cost", "",
            "Cells: accuracy ± standard error (sqrt(p(1-p)/n)) / total tokens (prompt + completion, summed "
            "over the evaluated items).", ""]
    out += _table(rows, lambda r: f"{r.accuracy:.3f} ± {r.accuracy_se:.3f} / {fmt_tokens(r.tokens_total)}")
    out += ["", "## Tokens per correct answer", "", "Total tokens / correct answers ('-': none correct).", ""]
    out += _table(rows, lambda r: fmt_tokens(r.tokens_per_correct))
    out += ["", "## Communication", "",
            "Cells: communicated tokens / mean turns (non-silent messages) / silence rate / calls skipped per "
            "episode / share of messages that hit the message cap / grading errors.", ""]
    out += _table(rows, lambda r: f"{fmt_tokens(r.tokens_communicated)} / {r.turns:.2f} / "
                                  f"{r.silence_rate:.2f} / {r.calls_skipped:.2f} / "
                                  f"{'-' if r.cap_hit_rate is None else format(r.cap_hit_rate, '.2f')} / "
                                  f"{r.grading_errors}")
    split = [r for r in rows if r.silence_informed is not None or r.silence_uninformed is not None]
    if split:  # split-information tasks: who fell silent matters, not only how often
        out += ["", "## Silence by role", "",
                "Split-information benchmarks only. Cells: share of turns in which the agents without the fact "
                "were silent / the same for the agent holding it ('-': no such turn).", ""]
        out += _table(split, lambda r: f"{_share(r.silence_uninformed)} / {_share(r.silence_informed)}")
    out += ["", "## Summary over benchmarks", "",
            "| System | accuracy (macro) | accuracy (pooled) | n | tokens total | tokens / item | tokens / correct |",
            "|---|---|---|---|---|---|---|"]
    for system, s in summary.items():
        out.append(f"| {system} | {s['accuracy']:.3f} | {s['accuracy_micro']:.3f} | {s['n']} | "
                   f"{fmt_tokens(s['tokens_total'])} | {fmt_tokens(s['tokens_total_mean'])} | "
                   f"{fmt_tokens(s['tokens_per_correct'])} |")
    return "\n".join(out) + "\n"


def benchmark_metrics(rows: Sequence[EvalRow], benchmark: str) -> dict[str, dict[str, Any]]:
    """DVC metrics of one benchmark: ``{system: {metric: number}}`` (two levels, numbers or null)."""
    return {r.system: {k: getattr(r, k) for k in DVC_KEYS} for r in rows if r.benchmark == benchmark}


def write_reports(out_dir: str | Path, rows: Sequence[EvalRow], summary: Mapping[str, Any],
                  meta: Mapping[str, Any], markdown: str) -> dict[str, Path]:
    """Write the JSON metrics and the markdown report; returns ``{name: path}``."""
    out = Path(out_dir)
    paths: dict[str, Path] = {}
    _, benchmarks = _order(rows)
    for b in benchmarks:
        path = out / f"{b}.json"
        write_json_atomic(path, benchmark_metrics(rows, b))
        paths[b] = path
    paths["summary"] = out / "summary.json"
    write_json_atomic(paths["summary"], {"systems": dict(summary), "rows": [r.to_dict() for r in rows],
                                         "meta": dict(meta)})
    paths["report"] = out / "report.md"
    write_text_atomic(paths["report"], markdown)
    return paths
