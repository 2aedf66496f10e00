"""Choose one of two candidate recipes on dev items, by a frozen selection rule (issue 52).

A recipe chosen on the test items it is then judged on has been fitted to them: every earlier
seven-benchmark report is exploratory for that reason. Here two trained candidates are evaluated on
the dev set (``experiments.eval_split=devset``: items disjoint from the test sample), a versioned
selection rule (:data:`experiments.rules.SELECTIONS`) picks one, and only the chosen model plays the
test items, once. This module is the pure part: reading what the choice may rest on, refusing files
that do not fit together, and the choice itself.

Rule ``s1`` (its fields in :class:`experiments.rules.SelectionRule`): the paired macro accuracy
difference ``b − a`` over the dev items with its two-sided interval at ``confidence`` (one-sided
bounds at ``(1 + confidence) / 2``, :func:`components.comparison.macro_interval`); an interval
above 0 picks ``b``, below 0 picks ``a``; one covering 0 picks the candidate with fewer total
tokens per item (the macro mean over benchmarks; ``a`` on an exact tie, the order being fixed
before the data).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from components.comparison import Interval, macro_interval
from components.errors import UserError
from experiments.definitions import settings_diff
from experiments.evidence import MAIN
from experiments.results import ResultsFile
from experiments.rules import SelectionRule
from experiments.stats import ItemColumns


class DevChoiceError(UserError):
    """Candidate files the choice cannot rest on (wrong split, other items or settings, no items)."""


@dataclass(frozen=True)
class Candidate:
    """One candidate on the dev items: per-benchmark outcomes of its trained team."""

    name: str
    items: dict[str, ItemColumns]
    """benchmark -> per-item outcomes (sample order)"""

    @property
    def accuracy(self) -> float:
        """Macro accuracy over benchmarks."""
        return statistics.fmean(statistics.fmean(c.correct) for c in self.items.values())

    @property
    def tokens_per_item(self) -> float:
        """Total tokens per item, macro mean over benchmarks (the ``tokens_total`` tie-break)."""
        return statistics.fmean(statistics.fmean(c.tokens_total) for c in self.items.values())


@dataclass(frozen=True)
class Choice:
    chosen: str
    a: Candidate
    b: Candidate
    difference: Interval
    """macro accuracy b − a over the dev items; low / high are the two-sided interval's ends"""
    reason: str


def candidate(res: ResultsFile, where: str) -> Candidate:
    """The trained team of a dev-set results file; :class:`DevChoiceError` naming ``where`` otherwise."""
    if res.eval_split != "devset":
        raise DevChoiceError(f"{where}: evaluated on {res.eval_split!r}, not on the dev set "
                             "(experiments.eval_split=devset); a choice may not look at test items")
    if res.kind != "gspo":
        raise DevChoiceError(f"{where}: kind {res.kind!r}; a candidate is a trained recipe (kind gspo)")
    items = (res.items or {}).get(MAIN)
    if not items:
        raise DevChoiceError(f"{where}: no per-item outcomes of {MAIN!r} (items.{MAIN}); the paired difference "
                             "needs them")
    return Candidate(res.name, dict(items))


def check_comparable(a: ResultsFile, b: ResultsFile, where: tuple[str, str]) -> None:
    """Same dev items and the same comparison settings, or :class:`DevChoiceError` saying what differs."""
    if a.item_ids_sha256 != b.item_ids_sha256:
        raise DevChoiceError(f"{where[0]} and {where[1]}: other items (item_ids_sha256 {a.item_ids_sha256[:12]}… vs "
                             f"{b.item_ids_sha256[:12]}…); a paired choice needs the same dev items")
    diff = settings_diff(a.settings, b.settings)
    if diff:
        raise DevChoiceError(f"{where[0]} and {where[1]}: settings differ ({'; '.join(diff)})")
    if sorted(a.benchmarks) != sorted(b.benchmarks):
        raise DevChoiceError(f"{where[0]} and {where[1]}: benchmarks differ ({a.benchmarks} vs {b.benchmarks})")


def paired_accuracy(a: Candidate, b: Candidate, confidence: float) -> Interval:
    """Macro accuracy ``b − a`` with the two-sided interval at ``confidence``."""
    missing = sorted(set(a.items) ^ set(b.items))
    if missing:
        raise DevChoiceError(f"{a.name} and {b.name}: per-item outcomes for other benchmarks ({', '.join(missing)})")
    diffs: dict[str, Sequence[float]] = {}
    for bench, col_a in a.items.items():
        col_b = b.items[bench]
        if len(col_a.correct) != len(col_b.correct):
            raise DevChoiceError(f"{a.name} and {b.name}: {bench} has {len(col_a.correct)} vs {len(col_b.correct)} "
                                 "items")
        diffs[bench] = [float(y) - float(x) for x, y in zip(col_a.correct, col_b.correct, strict=True)]
    return macro_interval(diffs, (1.0 + confidence) / 2.0)


def choose(files: Mapping[str, ResultsFile], order: tuple[str, str], rule: SelectionRule,
           where: Mapping[str, str] | None = None) -> Choice:
    """Apply ``rule`` to the two candidates ``order`` = (a, b) of ``files`` (name -> dev results file)."""
    where = where or {n: n for n in order}
    for n in order:
        if n not in files:
            raise DevChoiceError(f"{where.get(n, n)}: no dev results file for candidate {n!r}")
    if rule.tie_break != "tokens_total":
        raise DevChoiceError(f"selection rule tie_break {rule.tie_break!r}: only 'tokens_total' is implemented")
    fa, fb = files[order[0]], files[order[1]]
    check_comparable(fa, fb, (where[order[0]], where[order[1]]))
    a, b = candidate(fa, where[order[0]]), candidate(fb, where[order[1]])
    d = paired_accuracy(a, b, rule.confidence)
    facts = f"{b.name} − {a.name} {d.mean:+.4f}, {rule.confidence:.0%} interval [{d.low:+.4f}, {d.high:+.4f}]"
    if d.low > 0:
        return Choice(b.name, a, b, d, f"{b.name} is more accurate beyond noise ({facts})")
    if d.high < 0:
        return Choice(a.name, a, b, d, f"{a.name} is more accurate beyond noise ({facts})")
    cheaper = b if b.tokens_per_item < a.tokens_per_item else a
    return Choice(cheaper.name, a, b, d,
                  f"accuracy does not separate them ({facts}, covering 0), so the one with fewer total tokens per "
                  f"item: {cheaper.name} ({a.name} {a.tokens_per_item:.1f}, {b.name} {b.tokens_per_item:.1f})")
