"""Statistics the report's verdicts rest on, written so that a verdict can fail.

* Accuracy differences are **paired**: every system answers the same seeded items, so the right
  standard error is that of the per-item differences, not ``sqrt(se_a² + se_b²)`` (which ignores
  that both sides got the same easy and hard items). Over several benchmarks the difference is the
  macro mean of the per-benchmark paired differences, with ``sqrt(Σ se_b²) / n_benchmarks``.
* A trained run **moved** away from its base policy when its logged KL from the base
  (``gspo/kl_base``) reached ``kl_moved`` (:mod:`experiments.rules`), or when its held-out
  completion tokens per item differ from the untrained MAS's by more than ``z_moved`` paired
  standard errors. A comparison between runs that did not move compares the base policy with
  itself: INCONCLUSIVE, never PASS.
* Budget tracking is judged over the last ``window`` or more training episodes, two-sided,
  and a met band counts as *held by the controller* only if λ_tok had settled over those steps
  (:func:`controller_settled`): a band met while λ sat clipped at a bound, while λ was still
  sweeping, or with token use on one side of B in every step, is where the policy happened to sit,
  not a set point the dual held (INCONCLUSIVE). Next to the verdict the report shows the same rule
  as if training had stopped at each step of the last third (:func:`rule_at_endings`): how much
  the verdict owes to where the run stopped.

Hand-written: these are a few lines of arithmetic over lists (mean, sample standard deviation);
scipy would add a dependency for nothing a reader could not check by eye.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, NonNegativeInt, model_validator

from experiments.rules import VerdictRules


class ItemColumns(BaseModel):
    """One system on one benchmark, per item in sample order: what paired comparisons need."""

    model_config = ConfigDict(extra="forbid")

    correct: list[bool]
    tokens_total: list[NonNegativeInt]
    tokens_completion: list[NonNegativeInt]

    @model_validator(mode="after")
    def _one_row_per_item(self) -> ItemColumns:
        lengths = {len(self.correct), len(self.tokens_total), len(self.tokens_completion)}
        if len(lengths) != 1:
            raise ValueError(f"correct, tokens_total and tokens_completion must have one entry per item (lengths "
                             f"{len(self.correct)}, {len(self.tokens_total)}, {len(self.tokens_completion)})")
        if any(c > t for c, t in zip(self.tokens_completion, self.tokens_total, strict=True)):
            raise ValueError("an item's tokens_completion exceeds its tokens_total")
        return self


@dataclass(frozen=True)
class Paired:
    """Mean of a − b over shared items and its standard error (macro over benchmarks)."""

    diff: float
    se: float
    n: int
    benchmarks: tuple[str, ...]

    def not_below(self, se_margin: float) -> bool:
        """Within ``se_margin`` standard errors of zero, or above (``VerdictRules.se_margin``)."""
        return self.diff >= -se_margin * self.se


def paired(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Mean of ``a − b`` over the same items and the standard error of that mean."""
    if len(a) != len(b):
        raise ValueError(f"paired: {len(a)} vs {len(b)} items; a paired comparison needs the same items")
    d = [float(x) - float(y) for x, y in zip(a, b, strict=True)]
    mean = statistics.fmean(d) if d else 0.0
    se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else 0.0
    return mean, se


def paired_macro(a: Mapping[str, ItemColumns], b: Mapping[str, ItemColumns], field: str = "correct") -> Paired | None:
    """Paired difference of ``field`` (a − b) per shared benchmark, macro-averaged; None when the two
    share no benchmark with the same number of items."""
    shared = [x for x in a if x in b and len(getattr(a[x], field)) == len(getattr(b[x], field)) > 0]
    if not shared:
        return None
    parts = [paired(getattr(a[x], field), getattr(b[x], field)) for x in shared]
    nb = len(parts)
    return Paired(diff=sum(p[0] for p in parts) / nb, se=math.sqrt(sum(p[1] ** 2 for p in parts)) / nb,
                  n=sum(len(getattr(a[x], field)) for x in shared), benchmarks=tuple(shared))


@dataclass(frozen=True)
class Movement:
    moved: bool
    why: str


def movement(history: Sequence[Mapping[str, float]], trained: Mapping[str, ItemColumns] | None,
             untrained: Mapping[str, ItemColumns] | None, rules: VerdictRules,
             tokens: str = "tokens_completion") -> Movement:
    """Did a trained run move away from its base policy? (See the module docstring for the rule;
    ``tokens`` names the per-item token column compared.)"""
    kl_moved, z = rules.kl_moved, rules.z_moved
    reasons = []
    kl = [float(h["gspo/kl_base"]) for h in history if "gspo/kl_base" in h]
    if kl:
        peak = max(kl)
        if peak >= kl_moved:
            return Movement(True, f"KL from the base reached {peak:.2g} (>= {kl_moved:g})")
        reasons.append(f"KL from the base at most {peak:.2g} (< {kl_moved:g})")
    else:
        reasons.append("no KL from the base logged")
    pair = paired_macro(trained, untrained, tokens) if trained and untrained else None
    what = tokens.removeprefix("tokens_")
    if pair is not None:
        if abs(pair.diff) > z * pair.se:
            return Movement(True, f"held-out {what} tokens per item changed by {pair.diff:+.1f} "
                                  f"(> {z:g} paired SE of {pair.se:.1f})")
        reasons.append(f"held-out {what} tokens per item changed by {pair.diff:+.1f}, within {z:g} "
                       f"paired SE ({pair.se:.1f})")
    else:
        reasons.append("no per-item held-out tokens to compare with the untrained MAS")
    return Movement(False, "; ".join(reasons))


def last_episodes(history: Sequence[Mapping[str, float]], key: str, window: int) -> tuple[float | None, int]:
    """Episode-weighted mean of ``key`` over the last steps that hold >= ``window`` episodes, and
    how many episodes that was (the whole history when it holds fewer; None without episode counts)."""
    steps = _window_steps(history, key, window)
    weight = sum(float(h["train/episodes"]) for h in steps)
    total = sum(float(h[key]) * float(h["train/episodes"]) for h in steps)
    return (total / weight if weight else None), int(weight)


def window_standard_error(history: Sequence[Mapping[str, float]], key: str, window: int) -> float | None:
    """Standard error of :func:`last_episodes`' mean, from the spread of the judged steps' means:
    sample sd / sqrt(steps) (None with fewer than two steps). Steps are the sampling unit because the
    history keeps one mean per step, not per episode; it says how far a window of this size moves by
    noise alone, which a ±band narrower than it cannot resolve. Reported, never part of a verdict."""
    values = [float(h[key]) for h in _window_steps(history, key, window)]
    if len(values) < 2 or not all(math.isfinite(v) for v in values):
        return None
    return statistics.stdev(values) / math.sqrt(len(values))


@dataclass(frozen=True)
class Endings:
    """The budget rule judged as if training had stopped at each of the last steps (:func:`rule_at_endings`)."""

    first_step: int
    last_step: int
    judged: int
    """stopping steps whose window held enough episodes to judge"""
    inside: int
    """of those, the ones whose window mean lay within the band"""
    held: int
    """inside the band with λ_tok settled (what the verdict calls held by the controller)"""
    below: int
    """window mean below B"""

    def text(self) -> str:
        return (f"the same rule had training stopped at each step from {self.first_step} to {self.last_step} "
                f"(reported, not part of the verdict): inside the band at {self.inside} of {self.judged}, held by "
                f"λ at {self.held}, below B at {self.below}")


def rule_at_endings(history: Sequence[Mapping[str, float]], target: float, band: float, rules: VerdictRules,
                    share: float = 1 / 3) -> Endings | None:
    """The budget rule (window mean within ``band`` of ``target``, :func:`controller_settled`) applied to
    ``history[:n]`` for every ``n`` in the last ``share`` of the steps: how much the verdict depends on
    where the run stopped. A 4-step window of a noisy per-step mean can miss a band its controller is
    centred on, or meet one it is not, and one verdict does not say which. Reported next to the
    verdict, never part of it. Steps are counted from 1 in history order (one entry per step). None
    without a finite, positive target, or when no stopping step's window holds ``window`` episodes."""
    if not (math.isfinite(target) and target > 0) or not history:
        return None
    window = rules.window
    n = len(history)
    first = max(1, n - max(1, math.ceil(share * n)) + 1)
    judged = inside = held = below = 0
    for end in range(first, n + 1):
        got, count = last_episodes(history[:end], "train/budget_tokens", window)
        if got is None or count < window or not math.isfinite(got):
            continue
        err = got / target - 1.0
        judged += 1
        below += err < 0
        if abs(err) <= band:
            inside += 1
            held += controller_settled(history[:end], rules)[0] is True
    return Endings(first, n, judged, inside, held, below) if judged else None


def _window_steps(history: Sequence[Mapping[str, float]], key: str, window: int) -> list[Mapping[str, float]]:
    """The last steps holding ``key`` (and an episode count) whose episodes add up to >= ``window``,
    oldest first; the whole history when it holds fewer. :func:`last_episodes` and
    :func:`controller_settled` judge the same steps through this one walk."""
    out: list[Mapping[str, float]] = []
    weight = 0.0
    for h in reversed(history):
        if key not in h or "train/episodes" not in h:
            continue
        out.append(h)
        weight += float(h["train/episodes"])
        if weight >= window:
            break
    return out[::-1]


def _one_sided(steps: Sequence[Mapping[str, float]]) -> str:
    """"above" / "below" when every step's token use (``train/budget_tokens``) lay on that side of its B
    (``train/budget``), else "" (also when B was not logged or there are fewer than two steps)."""
    errors = [float(h["train/budget_tokens"]) - float(h["train/budget"]) for h in steps if "train/budget" in h]
    if len(errors) < 2 or len(errors) < len(steps) or not all(math.isfinite(e) for e in errors):
        return ""
    return "above" if all(e > 0 for e in errors) else "below" if all(e < 0 for e in errors) else ""


def controller_settled(history: Sequence[Mapping[str, float]], rules: VerdictRules) -> tuple[bool | None, str]:
    """Had the dual controller settled over the steps :func:`last_episodes` judges?

    None when it cannot be told: λ logged in fewer than two judged steps, or not finite somewhere in
    the run.

    ``train/lambda_tok`` is the λ each step's batch was rewarded with. Not settled when
    - λ is the same in every step of the window: dual ascent on a non-zero error always moves λ, so a
      constant λ was clipped at a bound (or the dual was off): a fixed price, not regulation;
    - λ sits exactly at the edge of its range over the run in at least half (and >= 2) of the judged
      steps (a value dual ascent repeats only when it is clipped); or
    - λ's net change across the window exceeds ``drift`` of the range it covered over the run:
      the controller was still integrating an error the policy did not answer; or
    - token use lay on one side of B (``train/budget``) in every judged step: a controller holding B
      sees errors of both signs, while a one-signed error only winds λ one way (a slow sweep over a
      wide range passes the drift test; one run of the proof fell from -0.73 to -1.00 at 27 % under B).
    Either way tokens inside the band sit where the policy settled, not where λ held them.
    """
    steps = _window_steps(history, "train/budget_tokens", rules.window)
    drift = rules.drift
    lam = [float(h["train/lambda_tok"]) for h in steps if "train/lambda_tok" in h]
    run = [float(h["train/lambda_tok"]) for h in history if "train/lambda_tok" in h]
    if len(lam) < 2:
        return None, "λ_tok not logged for the judged steps"
    if not all(math.isfinite(x) for x in run):
        return None, "λ_tok not finite in every step: cannot tell whether the controller settled"
    first, last = lam[0], lam[-1]
    if max(lam) - min(lam) <= 1e-9:
        return False, (f"λ_tok was {last:.3f} in all {len(lam)} judged steps: clipped at a bound (or the dual was "
                       "off), a fixed price, not a controller regulating token use")
    for edge in (max(run), min(run)):
        k = sum(1 for x in lam if x == edge)
        if k >= 2 and 2 * k >= len(lam):
            return False, (f"λ_tok sat at {edge:.3f}, the edge of its range over the run (a clip), in {k} of "
                           f"{len(lam)} judged steps: a fixed price, not a controller regulating token use")
    span = max(run) - min(run)
    if abs(last - first) > drift * span:
        return False, (f"λ_tok still moving: {first:+.3f} -> {last:+.3f} over the {len(lam)} judged steps, "
                       f"{abs(last - first) / span:.0%} of its range over the run [{min(run):+.3f}, {max(run):+.3f}] "
                       f"(settled: <= {drift:.0%})")
    side = _one_sided(steps)
    if side:
        return False, (f"token use was {side} B in all {len(steps)} judged steps: λ_tok ({first:+.3f} -> {last:+.3f}) "
                       "only wound one way, it did not regulate around B")
    return True, (f"λ_tok settled: {first:+.3f} -> {last:+.3f} over the {len(lam)} judged steps "
                  f"(<= {drift:.0%} of its range over the run [{min(run):+.3f}, {max(run):+.3f}])")


@dataclass(frozen=True)
class Cost:
    """One system over a set of benchmarks: macro accuracy, total tokens per item, accuracy per 1k tokens."""

    label: str
    accuracy: float
    tokens_per_item: float

    @property
    def per_1k(self) -> float:
        return 1000.0 * self.accuracy / self.tokens_per_item if self.tokens_per_item else 0.0


def equal_tokens(team: Cost, singles: Sequence[Cost]) -> Cost | None:
    """The single-agent system closest to the team's tokens per item, not below them where one is not."""
    if not singles:
        return None
    above = [s for s in singles if s.tokens_per_item >= team.tokens_per_item]
    if above:
        return min(above, key=lambda s: s.tokens_per_item - team.tokens_per_item)
    return max(singles, key=lambda s: s.tokens_per_item)
