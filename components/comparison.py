"""Paired comparison of two systems on the same items: is one better beyond noise, or only tied?

Every decision that crowns one model over another (the promotion gate, a search's best trial
against the current parameters) reads this module, so "better" means one thing everywhere:

* **Same items.** Both systems answered the same item ids of the same benchmarks; anything else is
  :class:`IncomparableItems` (a different item sample is a different question, not noise).
* **Macro, paired.** Per benchmark the per-item differences ``a_i − b_i`` give a mean and a
  standard error ``sd / sqrt(n)``; over benchmarks the mean is the macro mean and the standard
  error ``sqrt(Σ se_b²) / B`` (each benchmark weighs the same, as in the headline accuracy).
* **One-sided bounds** at ``confidence`` from Student's t with ``n − B`` degrees of freedom. A
  tie (every difference zero) has standard error 0 and lower bound 0: it never counts as better.
  A benchmark with one paired item has no standard error to estimate (its ``sd`` is undefined, not
  0): the macro interval is then unbounded, so one lucky item never decides (``tie`` at best).

The rule (:func:`paired_verdict`), with the thresholds of :class:`ComparisonRule`:

* fewer than ``min_items`` shared items: ``too_few`` (nothing is decided on a handful of items);
* ``better``: accuracy higher beyond noise (lower bound of the accuracy difference > 0) and
  tokens not above ``max_token_ratio`` x the reference's (point estimate: a more accurate model
  may not buy its accuracy with an unbounded token bill);
* ``cheaper``: accuracy not worse than the non-inferiority ``margin`` (lower bound > −margin)
  and tokens lower by ``token_factor`` beyond noise (upper bound of ``tok_a − factor·tok_b`` < 0);
* ``costlier``: more accurate beyond noise but above ``max_token_ratio``;
* otherwise ``worse`` when accuracy is lower beyond noise, else ``tie``.

Written here rather than taken from scipy.stats: scipy has the t quantile (used) but no macro
paired interval over several item groups; the arithmetic is a few lines a reader can check.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from scipy.stats import t as student_t

from components.errors import UserError

Outcome = Literal["better", "cheaper", "costlier", "tie", "worse", "too_few"]
WINS: frozenset[str] = frozenset({"better", "cheaper"})
"""the outcomes under which the first system replaces the second"""


class IncomparableItems(UserError):
    """The two systems were not measured on the same items (benchmarks or ids differ)."""


@dataclass(frozen=True)
class ItemScore:
    """One system's result on one item: what a paired comparison needs."""

    id: str
    correct: bool
    tokens_total: float


@dataclass(frozen=True)
class ComparisonRule:
    """Thresholds of the paired rule (module docstring); recorded with every decision."""

    confidence: float = 0.95
    margin: float = 0.02
    """non-inferiority margin on accuracy (absolute, e.g. 0.02 = two points)"""
    token_factor: float = 0.9
    """``cheaper`` needs tokens <= this x the reference's, beyond noise"""
    max_token_ratio: float = 1.10
    """``better`` allows at most this x the reference's tokens (point estimate)"""
    min_items: int = 50
    """fewer shared items than this decide nothing"""

    def __post_init__(self) -> None:
        checks = [(0.5 <= self.confidence < 1.0, "confidence must be in [0.5, 1)"),
                  (0.0 <= self.margin < 1.0, "margin must be in [0, 1)"),
                  (0.0 < self.token_factor <= 1.0, "token_factor must be in (0, 1]"),
                  (self.max_token_ratio >= 1.0 and math.isfinite(self.max_token_ratio),
                   "max_token_ratio must be finite and >= 1"),
                  (self.min_items >= 2, "min_items must be >= 2")]
        for ok, text in checks:
            if not ok:
                raise ValueError(f"comparison rule: {text}")

    def describe(self) -> str:
        return (f"paired t, one-sided {self.confidence:.0%}; better: accuracy up beyond noise with tokens <= "
                f"{self.max_token_ratio:g}x; cheaper: accuracy >= -{self.margin:g} (non-inferiority) and tokens "
                f"<= {self.token_factor:g}x beyond noise; at least {self.min_items} items")


@dataclass(frozen=True)
class Interval:
    """Macro mean of paired differences, its standard error and one-sided bounds at the rule's confidence."""

    mean: float
    se: float
    low: float
    high: float
    n: int
    benchmarks: tuple[str, ...]

    def text(self, fmt: str = ".4f") -> str:
        return f"{self.mean:+{fmt}} (SE {self.se:{fmt}}, one-sided bounds [{self.low:+{fmt}}, {self.high:+{fmt}}])"


@dataclass(frozen=True)
class PairedVerdict:
    """What :func:`paired_verdict` found: the outcome, its one-line reason and the intervals."""

    outcome: Outcome
    reason: str
    accuracy: Interval
    """accuracy of a − accuracy of b"""
    tokens: Interval
    """tokens of a − token_factor x tokens of b (per item)"""
    token_ratio: float
    """macro mean tokens of a / of b (point estimate; inf when b spent none)"""
    n: int

    @property
    def wins(self) -> bool:
        return self.outcome in WINS


def aligned(a: Mapping[str, Sequence[ItemScore]], b: Mapping[str, Sequence[ItemScore]]
            ) -> dict[str, tuple[list[ItemScore], list[ItemScore]]]:
    """Per benchmark, both systems' items in one id order; :class:`IncomparableItems` unless both
    hold the same benchmarks with the same item ids (each id once)."""
    if set(a) != set(b):
        raise IncomparableItems(f"the two evaluations cover different benchmarks ({', '.join(sorted(a))} vs "
                                f"{', '.join(sorted(b))}); compare them under one setting")
    out = {}
    for bench in sorted(a):
        ia, ib = {s.id: s for s in a[bench]}, {s.id: s for s in b[bench]}
        if len(ia) != len(a[bench]) or len(ib) != len(b[bench]):
            raise IncomparableItems(f"{bench}: an item id occurs twice in one evaluation")
        if set(ia) != set(ib):
            only = sorted(set(ia) ^ set(ib))
            raise IncomparableItems(f"{bench}: the evaluations hold different items ({len(only)} ids in one only, "
                                    f"e.g. {only[0]!r}); compare them under one setting")
        ids = sorted(ia)
        out[bench] = ([ia[i] for i in ids], [ib[i] for i in ids])
    return out


def macro_interval(diffs: Mapping[str, Sequence[float]], confidence: float) -> Interval:
    """Macro mean of per-benchmark paired differences with one-sided bounds (module docstring)."""
    groups = {k: [float(x) for x in v] for k, v in diffs.items() if len(v) > 0}
    if not groups:
        raise IncomparableItems("no shared items to compare")
    nb, n = len(groups), sum(len(v) for v in groups.values())
    mean = sum(statistics.fmean(v) for v in groups.values()) / nb
    if any(len(v) < 2 for v in groups.values()):  # an unknown variance, not a zero one
        return Interval(mean, math.inf, -math.inf, math.inf, n, tuple(sorted(groups)))
    var = sum(statistics.stdev(v) ** 2 / len(v) for v in groups.values())
    se = math.sqrt(var) / nb
    df = max(1, n - nb)
    half = float(student_t.ppf(confidence, df)) * se
    return Interval(mean, se, mean - half, mean + half, n, tuple(sorted(groups)))


def paired_verdict(a: Mapping[str, Sequence[ItemScore]], b: Mapping[str, Sequence[ItemScore]],
                   rule: ComparisonRule) -> PairedVerdict:
    """Does system ``a`` beat system ``b`` on the same items, beyond noise? (module docstring)"""
    pairs = aligned(a, b)
    acc = macro_interval({k: [float(x.correct) - float(y.correct) for x, y in zip(*v, strict=True)]
                          for k, v in pairs.items()}, rule.confidence)
    tok = macro_interval({k: [x.tokens_total - rule.token_factor * y.tokens_total for x, y in zip(*v, strict=True)]
                          for k, v in pairs.items()}, rule.confidence)
    mean_a = sum(statistics.fmean(x.tokens_total for x in v[0]) for v in pairs.values()) / len(pairs)
    mean_b = sum(statistics.fmean(y.tokens_total for y in v[1]) for v in pairs.values()) / len(pairs)
    ratio = mean_a / mean_b if mean_b > 0 else (1.0 if mean_a == 0 else math.inf)
    n = acc.n
    facts = (f"accuracy difference {acc.text()}, tokens {ratio:.3f}x (tokens - {rule.token_factor:g}x: "
             f"{tok.text('.1f')}) on {n} paired items")
    if n < rule.min_items:
        return PairedVerdict("too_few", f"too few items: {n} < min_items {rule.min_items}; {facts}", acc, tok, ratio, n)
    if acc.low > 0 and ratio <= rule.max_token_ratio:
        outcome: Outcome = "better"
        why = (f"more accurate beyond noise (lower bound {acc.low:+.4f} > 0) at {ratio:.3f}x <= "
               f"{rule.max_token_ratio:g}x tokens")
    elif acc.low > -rule.margin and tok.high < 0:
        outcome = "cheaper"
        why = (f"not worse than the margin (lower bound {acc.low:+.4f} > -{rule.margin:g}) and tokens below "
               f"{rule.token_factor:g}x beyond noise")
    elif acc.low > 0:
        outcome, why = "costlier", f"more accurate beyond noise but at {ratio:.3f}x > {rule.max_token_ratio:g}x tokens"
    elif acc.high < 0:
        outcome, why = "worse", f"less accurate beyond noise (upper bound {acc.high:+.4f} < 0)"
    else:
        outcome, why = "tie", "no difference beyond noise"
    return PairedVerdict(outcome, f"{outcome}: {why}; {facts}", acc, tok, ratio, n)
