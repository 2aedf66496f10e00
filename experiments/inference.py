"""The study's statistical tests, for verdict rules from version 2 on (docs/results.md explains them).

Why these, and not "within one standard error": a difference within one SE of zero passes 84 % of the
time when the true difference is zero, and passes more easily the noisier the data; it proves nothing.
A *non-inferiority* claim instead fixes a margin before the run and passes only when the lower
one-sided 95 % bound of the paired difference (trained − reference, macro over benchmarks, the same
paired t as the product's gate in :mod:`components.comparison`) lies above ``-margin``. The report
prints how many items 80 % power at that margin needs, so an underpowered run is visible as one.

Accuracy at 135M parameters can sit at chance on multiple-choice benchmarks, where "no worse" is
meaningless: :func:`above_chance` is the one-sided exact binomial test against the guessing rate.

An agent that is silent before any answer exists on (nearly) every item has not learnt *strategic*
silence: the team collapsed to fewer agents. :func:`silence_profile` names that case and measures
whether silence depends on content (needed vs not needed, or an earlier answer vs none).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy.stats import binomtest, norm

from components.comparison import Interval, macro_interval


@dataclass(frozen=True)
class NonInferiority:
    """Paired non-inferiority of a system against a reference at a pre-stated ``margin``."""

    difference: Interval
    margin: float
    confidence: float
    power: float
    passed: bool
    items_for_power: int
    """items per benchmark that ``power`` needs at this margin (true difference 0, the observed SD)"""

    def text(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return (f"{verdict}: lower {self.confidence:.0%} bound {self.difference.low:+.4f} vs -margin "
                f"{-self.margin:+.4f} ({self.difference.n} paired items; {self.items_for_power} per benchmark "
                f"give {self.power:.0%} power)")


def items_for_power(sds: Sequence[float], margin: float, confidence: float, power: float) -> int:
    """Items per benchmark for a one-sided paired test of the macro mean at ``margin``.

    With ``B`` benchmarks of ``n`` items each, the macro mean's SE is ``sqrt(sum sd_b^2 / n) / B``;
    power ``1 - beta`` at a true difference of 0 needs ``SE <= margin / (z_conf + z_power)``, so
    ``n = (z_conf + z_power)^2 * sum sd_b^2 / (B * margin)^2`` (normal approximation).
    """
    if margin <= 0 or not sds:
        raise ValueError(f"items_for_power needs a positive margin and at least one SD (got {margin}, {list(sds)})")
    z = float(norm.ppf(confidence) + norm.ppf(power))
    need = z * z * sum(sd * sd for sd in sds) / (len(sds) * margin) ** 2
    return max(2, math.ceil(need))


def non_inferiority(diffs: Mapping[str, Sequence[float]], margin: float, confidence: float,
                    power: float) -> NonInferiority:
    """``diffs``: per benchmark, paired per-item differences (system − reference), shape [n_b]. The
    margin, confidence and power come from the verdict rule version that judges the run."""
    if not margin > 0:
        raise ValueError(f"the non-inferiority margin must be stated and positive (got {margin})")
    interval = macro_interval(diffs, confidence)
    sds = [_sd(v) for v in diffs.values() if len(v) > 0]
    need = items_for_power(sds, margin, confidence, power)
    return NonInferiority(interval, margin, confidence, power, interval.low > -margin, need)


def above_chance(correct: int, n: int, chance: float, alpha: float) -> tuple[bool, float]:
    """One-sided exact binomial test that accuracy ``correct / n`` exceeds the guessing rate ``chance``
    (e.g. 0.25 for MMLU's four choices, 0.2 for AQuA's five): (above chance at ``alpha``, p-value)."""
    if n <= 0 or not 0 <= correct <= n or not 0 < chance < 1:
        raise ValueError(f"above_chance needs 0 <= correct <= n, n > 0 and 0 < chance < 1 "
                         f"(got {correct}, {n}, {chance})")
    p = float(binomtest(correct, n, chance, alternative="greater").pvalue)
    return p < alpha, p


@dataclass(frozen=True)
class Turn:
    """One agent's first-round turn on one item: silent or not, and the condition it was in."""

    silent: bool
    answer_existed: bool
    """an answer had been said before this turn (never, when the first round is simultaneous)"""
    needed: bool | None = None
    """its information was needed (the proof task knows; None where nobody does)"""


@dataclass(frozen=True)
class SilenceProfile:
    """How an agent's silence depends on what it knew and what had been said."""

    agent: int
    turns: int
    silent_before_any_answer: float | None
    collapsed: bool
    """silent on >= ``collapse_share`` of the turns taken before any answer existed: a team of fewer
    agents, not strategy"""
    silent_when_needed: float | None
    silent_when_not_needed: float | None
    silent_after_an_answer: float | None

    def text(self) -> str:
        def pct(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.0%}"
        head = "COLLAPSE (a team of fewer agents)" if self.collapsed else "content-dependent or none"
        return (f"agent {self.agent}: {head}; silent before any answer {pct(self.silent_before_any_answer)}, "
                f"after an answer {pct(self.silent_after_an_answer)}, when needed {pct(self.silent_when_needed)}, "
                f"when not needed {pct(self.silent_when_not_needed)} ({self.turns} turns)")


def silence_profile(agent: int, turns: Sequence[Turn], collapse_share: float) -> SilenceProfile:
    """Silence rates of one agent by condition; ``collapsed`` at ``collapse_share`` (e.g. 0.9)."""
    before = _rate([t.silent for t in turns if not t.answer_existed])
    return SilenceProfile(
        agent=agent, turns=len(turns), silent_before_any_answer=before,
        collapsed=before is not None and before >= collapse_share,
        silent_when_needed=_rate([t.silent for t in turns if t.needed is True]),
        silent_when_not_needed=_rate([t.silent for t in turns if t.needed is False]),
        silent_after_an_answer=_rate([t.silent for t in turns if t.answer_existed]))


def _rate(flags: Sequence[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def _sd(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
