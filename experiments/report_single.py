"""Every team beside one agent at equal tokens (issue 52; verdict rules v2 on).

A team of three small models spends several times a single agent's tokens per item; a team that
is no more accurate per token than one agent thinking step by step (single-agent CoT) or voting over
k samples (self-consistency) has not shown that talking helps. For every multi-agent row the table
sets its macro accuracy, total tokens per item and accuracy per 1,000 tokens beside those of the
single-agent systems of the baselines file, over the benchmarks both evaluated. "Equal tokens" is
the single-agent system whose tokens per item are closest to the team's without being below them,
where one exists (else the closest below), with its token ratio.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from components.evaluation.runner import MAS_SYSTEMS
from experiments.evidence import BASELINES, MAIN
from experiments.results import EvalCell, ResultsFile
from experiments.stats import Cost, equal_tokens

SINGLE = {"single_cot": "CoT", "self_consistency": "SC"}
"""the single-agent systems of a baselines file, in the order the table shows them"""


class Row(Protocol):
    experiment: str
    system: str
    label: str
    cells: dict[str, EvalCell] | None


def cost(label: str, cells: Mapping[str, EvalCell], benches: Sequence[str]) -> Cost:
    sel = [cells[b] for b in benches]
    n = sum(c.n for c in sel)
    return Cost(label, sum(c.accuracy for c in sel) / len(sel), sum(c.tokens_total for c in sel) / n if n else 0.0)


def _k(base: ResultsFile | None) -> str:
    if base is None or base.self_consistency_k is None:
        return "self-consistency's k is `eval.self_consistency_k` of its profile, not recorded in the results file"
    return f"self-consistency votes over k = {base.self_consistency_k} samples"


def _fmt(c: Cost) -> str:
    return f"{c.accuracy:.3f} / {c.tokens_per_item:.0f} / {c.per_1k:.3f}"


def single_agent_section(rows: Sequence[Row], results: Mapping[str, ResultsFile]) -> list[str]:
    """The table and the one-sentence answer ([] without a baselines file with single-agent systems)."""
    base = results.get(BASELINES)
    singles = {s: base.eval[s] for s in SINGLE if base is not None and s in base.eval}
    teams = [r for r in rows if r.cells is not None and r.system in MAS_SYSTEMS]
    if not singles or not teams:
        return []
    out = ["## Every team against one agent at equal tokens", "",
           "Cells: macro accuracy / total tokens per item / accuracy per 1,000 tokens, over the benchmarks the team "
           f"and the single agent share. {', '.join(f'{v} = {k}' for k, v in SINGLE.items())} (the baselines file; "
           f"{_k(base)}). "
           "Equal tokens: the single-agent system whose tokens per item are closest to the team's and not below "
           "them where one exists (its tokens / the team's in brackets), and the accuracy difference "
           "team − it.", "",
           "| Team | experiment | team | " + " | ".join(SINGLE[s] for s in singles) + " | equal tokens | "
           "accuracy, team − it |", "|---|---|---|" + "---|" * len(singles) + "---|---|"]
    trained: list[tuple[str, Cost, list[Cost]]] = []
    for r in teams:
        cells = r.cells or {}
        shared = [b for b in cells if all(b in c for c in singles.values())]
        if not shared:
            continue
        team = cost(r.label, cells, shared)
        others = [cost(SINGLE[s], c, shared) for s, c in singles.items()]
        eq = equal_tokens(team, others)
        assert eq is not None
        out.append(f"| {r.label} | {r.experiment} | {_fmt(team)} | " + " | ".join(_fmt(o) for o in others)
                   + f" | {eq.label} ({eq.tokens_per_item / team.tokens_per_item:.2f}x) | "
                     f"{team.accuracy - eq.accuracy:+.3f} |")
        if r.system == MAIN:
            trained.append((r.experiment, team, others))
    return [*out, "", beats_sentence(trained), ""]


def beats_sentence(trained: Sequence[tuple[str, Cost, Sequence[Cost]]]) -> str:
    """Whether any trained team beats every single agent on accuracy per 1,000 tokens, with the numbers."""
    if not trained:
        return "No trained team in this set: nothing to compare with one agent."
    winners = [(n, t) for n, t, others in trained if all(t.per_1k > o.per_1k for o in others)]
    name, best, others = max(trained, key=lambda x: x[1].per_1k)
    theirs = ", ".join(f"{o.label} {o.per_1k:.3f}" for o in others)
    if winners:
        return (f"**{len(winners)} of {len(trained)} trained team(s) beat every single agent on accuracy per 1,000 "
                f"tokens** ({', '.join(n for n, _ in winners)}); the best, {name}: {best.per_1k:.3f} against "
                f"{theirs}.")
    return (f"**No trained team beats every single agent on accuracy per 1,000 tokens**: the best of "
            f"{len(trained)}, {name}, has {best.per_1k:.3f} against {theirs}.")
