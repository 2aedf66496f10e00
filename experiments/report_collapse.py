"""Collapse or strategic silence? (issue 52; verdict rules v2 on).

An agent silent before any answer exists on (nearly) every item has not learnt *when* to be silent:
the team has collapsed to fewer speaking agents. Round 0 of a ``simultaneous`` turn order is taken
before any answer exists, so its silence per agent (``ResultsFile.silence``) is the measure; an
agent silent on >= ``silence_collapse_share`` of those turns is named a collapse, per benchmark where
the file records silence per benchmark (``by_benchmark``), else on the aggregate (and the line says
so). Content dependence (silence when an earlier answer exists against when none does; in round 1,
after agreeing against disagreeing round-0 answers) is printed where the file records it
(``content``), and "not recorded in this file" where it does not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol

from components.evaluation.runner import MAS_SYSTEMS
from experiments.inference import Turn, silence_profile
from experiments.results import EvalCell, ResultsFile, SilenceContent, SilenceCounts, SilenceGridCounts
from experiments.rules import VerdictRulesV2

NOT_RECORDED = "content dependence: not recorded in this file"


class Row(Protocol):
    """One row of the report's tables (``experiments.report.Row`` fits it)."""

    experiment: str
    system: str
    label: str
    cells: dict[str, EvalCell] | None
    silence: SilenceCounts | None


def _turns(silent: int, sent: int, answer_existed: bool = False) -> list[Turn]:
    return [Turn(True, answer_existed)] * silent + [Turn(False, answer_existed)] * (sent - silent)


def collapsed_agents(grid: SilenceGridCounts, share: float) -> list[tuple[int, float]]:
    """(agent, round-0 silence rate) of every agent silent on >= ``share`` of its round-0 turns."""
    out = []
    for a, (srow, trow) in enumerate(zip(grid.silent, grid.sent, strict=True)):
        if not trow or not trow[0]:
            continue
        p = silence_profile(a, _turns(srow[0], trow[0]), share)
        if p.collapsed and p.silent_before_any_answer is not None:
            out.append((a, p.silent_before_any_answer))
    return out


def _named(found: list[tuple[int, float]], agents: int) -> str:
    who = ", ".join(f"agent {a} ({rate:.0%})" for a, rate in found)
    return (f"{who} silent before any answer: a collapse to {agents - len(found)} speaking "
            f"agent{'s' if agents - len(found) != 1 else ''}, not strategic silence")


def hidden_collapses(grid: SilenceGridCounts, share: float, benchmarks: int) -> dict[int, int]:
    """Agent -> how many of ``benchmarks`` equal-sized benchmarks could each hold a collapse that the
    pooled round-0 counts do not show: with ``S`` silent of ``N`` pooled turns, ``N / benchmarks``
    per benchmark, at most ``floor(S / ceil(share x N / benchmarks))`` benchmarks (only agents with 1+)."""
    out = {}
    for a, (srow, trow) in enumerate(zip(grid.silent, grid.sent, strict=True)):
        if not trow or not trow[0] or benchmarks < 2:
            continue
        need = math.ceil(share * trow[0] / benchmarks - 1e-9)
        if (k := min(benchmarks, srow[0] // max(1, need))) > 0:
            out[a] = k
    return out


def collapse_lines(silence: SilenceCounts | None, rules: VerdictRulesV2, benchmarks: int = 1) -> list[str]:
    """The collapse verdict of one system's held-out silence (per benchmark where recorded).

    Pooled counts below the share do not rule out a collapse on some benchmarks (an agent silent on
    every item of five benchmarks and on few of two pools to under 90 %): with ``benchmarks`` > 1 the
    verdict is then "undetermined" whenever the pooled counts allow one (:func:`hidden_collapses`)."""
    if silence is None:
        return ["silence per agent: not recorded in this file (no collapse test)"]
    share, agents = rules.silence_collapse_share, len(silence.sent)
    order = silence.content.turn_order if silence.content else "simultaneous"
    if order != "simultaneous" and silence.content is not None:
        grid = _before_answer_grid(silence.content)
        found = collapsed_agents(grid, share)
        where = f"over all benchmarks, round-0 turns taken before any answer ({order})"
        return [f"{where}: {_named(found, agents)}" if found else f"{where}: no collapse"]
    if silence.by_benchmark:
        lines = [f"on {b}: {_named(found, agents)}" for b, g in silence.by_benchmark.items()
                 if (found := collapsed_agents(g, share))]
        return lines or [f"no agent silent on >= {share:.0%} of its round-0 turns on any benchmark: no collapse"]
    found = collapsed_agents(silence, share)
    where = "over all benchmarks (this file records no per-benchmark silence)"
    if found:
        return [f"{where}: {_named(found, agents)}"]
    hidden = hidden_collapses(silence, share, benchmarks)
    if hidden:
        pooled = ", ".join(f"agent {a} silent on {silence.silent[a][0]}/{silence.sent[a][0]} round-0 turns, so on up "
                           f"to {k} of {benchmarks} benchmarks" for a, k in hidden.items())
        return [f"{where}: no agent silent on >= {share:.0%} of its pooled round-0 turns, but {pooled} it could be "
                f"silent on >= {share:.0%}: collapse undetermined (new runs record silence per benchmark)"]
    return [f"{where}: no agent silent on >= {share:.0%} of its round-0 turns on any benchmark: no collapse"]


def _before_answer_grid(c: SilenceContent) -> SilenceGridCounts:
    return SilenceGridCounts(silent=[[p[0]] for p in c.round0_no_answer], sent=[[p[1]] for p in c.round0_no_answer])


def content_lines(silence: SilenceCounts | None) -> list[str]:
    """Silence by condition, per agent; one "not recorded" line for files without it."""
    if silence is None or silence.content is None:
        return [NOT_RECORDED]
    c = silence.content

    def rate(pair: Sequence[int]) -> str:
        return f"{pair[0] / pair[1]:.0%} of {pair[1]}" if pair[1] else "n/a"
    return [f"agent {a}: round 0 before any answer {rate(c.round0_no_answer[a])}, after an answer "
            f"{rate(c.round0_after_answer[a])}; round 1 after agreeing answers {rate(c.round1_agreed[a])}, after "
            f"differing answers {rate(c.round1_disagreed[a])} ({c.turn_order})" for a in range(len(c.round0_no_answer))]


def collapse_section(rows: Sequence[Row], rules: VerdictRulesV2) -> list[str]:
    """Per multi-agent row: the collapse verdict and content dependence ([] without such rows)."""
    mas = [r for r in rows if r.cells is not None and r.system in MAS_SYSTEMS]
    if not mas:
        return []
    out = ["## Collapse or strategic silence?", "",
           f"An agent silent on >= {rules.silence_collapse_share:.0%} (`silence_collapse_share`) of its round-0 "
           "turns, taken before any answer exists (round 0 is simultaneous), is a collapse of the team to fewer "
           "speaking agents, not strategic silence. Judged per benchmark where the results file records silence "
           "per benchmark, else over all benchmarks (the line says which). Strategic silence would depend on "
           "content: the rates by condition follow where the file records them.", ""]
    for r in mas:
        out.append(f"- **{r.label}** ({r.experiment}): "
                   + "; ".join(collapse_lines(r.silence, rules, len(r.cells or {}))))
        out += [f"  - {line}" for line in content_lines(r.silence)]
    return [*out, ""]


def claim_collapse(results: Mapping[str, ResultsFile], name: str, system: str, rules: VerdictRulesV2) -> list[str]:
    """An evidence line for a claim when run ``name`` collapsed ([] when it did not or has no record)."""
    res = results.get(name)
    silence = None if res is None or res.silence is None else res.silence.get(system)
    if silence is None:
        return []
    lines = collapse_lines(silence, rules)
    if not any("collapse to" in line for line in lines):
        return []
    return [f"{name}: " + "; ".join(line for line in lines if "collapse to" in line)
            + " (its accuracy is that of the smaller team)"]
