"""Issue 52's tests in the seven-benchmark report, for verdict rules that carry them (v2 on).

Under a rules version without them (``v1``) nothing here runs and the report is what it was, byte for
byte. Under ``v2`` (:class:`experiments.rules.VerdictRulesV2`):

* every claim that read "within one standard error" is a non-inferiority test at the version's margin
  (:func:`ni_test`, the paired per-item differences of :mod:`experiments.inference`), with the items
  80 % power would need;
* each multiple-choice benchmark gets an "above chance?" table (one-sided exact binomial against
  1 / choices), and a claim comparing accuracy on a benchmark where neither side is above chance says
  that the difference there compares guesses (:func:`chance_caveat`);
* an agent silent on >= ``silence_collapse_share`` of its round-0 turns (round 0 is simultaneous in
  every committed run: silence before any answer exists) is a collapse to fewer speaking agents, not
  strategic silence (:mod:`experiments.report_collapse`);
* every team is set beside one agent at (about) equal tokens (:mod:`experiments.report_single`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeGuard

from components.data.spec import SPECS
from experiments.evidence import MAIN, items_of
from experiments.inference import NonInferiority, above_chance, non_inferiority
from experiments.results import EvalCell, ResultsFile
from experiments.rules import VerdictRules, VerdictRulesV2
from experiments.schema import RecordConfig

CHANCE: dict[str, float] = {name: 1.0 / spec.n_choices for name, spec in SPECS.items() if spec.n_choices}
"""guessing rate of each multiple-choice benchmark (1 / its options: mmlu 4, aqua 5; components/data/spec.py)"""


def is_v2(rules: VerdictRules) -> TypeGuard[VerdictRulesV2]:
    """True for a rules version that carries issue 52's tests."""
    return isinstance(rules, VerdictRulesV2)


def paired_diffs(results: Mapping[str, ResultsFile], a: tuple[str, str], b: tuple[str, str]
                 ) -> dict[str, list[float]] | None:
    """Per shared benchmark, per item, correct(a) − correct(b); None without per-item outcomes."""
    ia, ib = items_of(results, *a), items_of(results, *b)
    if not ia or not ib:
        return None
    diffs = {x: [float(p) - float(q) for p, q in zip(ia[x].correct, ib[x].correct, strict=True)]
             for x in ia if x in ib and len(ia[x].correct) == len(ib[x].correct) > 0}
    return diffs or None


def ni_test(results: Mapping[str, ResultsFile], a: tuple[str, str], b: tuple[str, str],
            rules: VerdictRulesV2) -> NonInferiority | None:
    """Is ``a`` no worse than ``b`` by more than ``ni_margin``? None when the files hold no paired items."""
    diffs = paired_diffs(results, a, b)
    return None if diffs is None else non_inferiority(diffs, rules.ni_margin, rules.ni_confidence, rules.power)


def ni_line(what: str, ni: NonInferiority | None, reference_accuracy: float | None = None) -> str:
    """The evidence line of one non-inferiority test (or why there is none); with the reference's
    accuracy it says how large the margin is against it (0.05 is half of an accuracy of 0.10)."""
    if ni is None:
        return (f"non-inferiority of {what}: cannot be tested, the results files hold no per-item outcomes to pair "
                "(INCONCLUSIVE, unless another condition already fails the claim)")
    share = ni.margin / reference_accuracy if reference_accuracy else None
    scale = "" if share is None else (f"; the margin is {share:.0%} of the reference's accuracy "
                                      f"{reference_accuracy:.3f}")
    if share is not None and share >= 0.5:
        scale += f": a PASS still allows losing {min(share, 1.0):.0%} of that accuracy, so it shows little"
    return f"non-inferiority of {what}: {ni.text()}{scale}"


def ni_title(rules: VerdictRulesV2) -> str:
    return f"non-inferior (margin {rules.ni_margin:g}, one-sided {rules.ni_confidence:.0%})"


def chance(cell: EvalCell, bench: str, rules: VerdictRulesV2) -> tuple[bool, float] | None:
    """(above chance, p) of one cell of a multiple-choice benchmark; None for other benchmarks."""
    if bench not in CHANCE or cell.n <= 0:
        return None
    return above_chance(cell.correct, cell.n, CHANCE[bench], rules.chance_alpha)


class ChanceRow:
    """What the chance table needs of a report row (``experiments.report.Row`` fits it)."""

    experiment: str
    label: str
    cells: dict[str, EvalCell] | None


def chance_section(rows: Sequence[ChanceRow], benches: Sequence[str], rules: VerdictRulesV2) -> list[str]:
    """The "above chance?" table: every system on every multiple-choice benchmark ([] when none ran)."""
    mc = [b for b in benches if b in CHANCE]
    ran = [r for r in rows if r.cells is not None and any(b in r.cells for b in mc)]
    if not ran:
        return []
    out = ["## Above chance?", "",
           f"Multiple-choice benchmarks only: correct / items, one-sided exact binomial test against guessing "
           f"({', '.join(f'{b} {CHANCE[b]:g}' for b in mc)}: 1 / options); **yes** when p < "
           f"{rules.chance_alpha:g} (`chance_alpha`). On a benchmark where a system is not above chance its "
           "accuracy is a guess, and a difference between two such systems says nothing about reasoning.", "",
           "| System | experiment | " + " | ".join(mc) + " |", "|---|---|" + "---|" * len(mc)]
    for r in ran:
        cells = r.cells or {}
        out.append(f"| {r.label} | {r.experiment} | " + " | ".join(
            _chance_cell(cells[b], b, rules) if b in cells else "-" for b in mc) + " |")
    return [*out, ""]


def _chance_cell(cell: EvalCell, bench: str, rules: VerdictRulesV2) -> str:
    test = chance(cell, bench, rules)
    if test is None:
        return "-"
    return f"{cell.correct} / {cell.n}, p {test[1]:.2f}: {'**yes**' if test[0] else 'no'}"


def chance_caveat(results: Mapping[str, ResultsFile], sides: Sequence[tuple[str, str]], rules: VerdictRulesV2
                  ) -> list[str]:
    """One evidence line when the compared systems share multiple-choice benchmarks on which none of
    them is above chance (the verdict then leans, on those, on guesses); [] otherwise."""
    cells = [results[e].eval.get(s, {}) if e in results else {} for e, s in sides]
    shared = [b for b in CHANCE if all(b in c for c in cells)]
    if not cells or not shared:
        return []
    guesses = [b for b in shared if not any((t := chance(c[b], b, rules)) is not None and t[0] for c in cells)]
    if not guesses:
        return []
    every = len({b for c in cells for b in c})
    names = " nor ".join(e if s == MAIN else f"{e}/{s}" for e, s in sides)
    return [f"chance: on {', '.join(guesses)} neither {names} is above chance (one-sided binomial, p >= "
            f"{rules.chance_alpha:g}; table 'Above chance?'): this verdict's accuracy difference leans on guesses "
            f"there ({len(guesses)} of {every} benchmarks)"]


def banner(record: RecordConfig) -> list[str]:
    """The report's status line when the results set is not a pre-registered test ([] otherwise)."""
    if record.status != "exploratory":
        return []
    why = f" {record.status_reason.rstrip('.')}." if record.status_reason else ""
    return [f"> **Exploratory, not a pre-registered test** (`experiments.record.status`).{why} Its verdicts "
            "describe these runs; they do not test the claims.", ""]
