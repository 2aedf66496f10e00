"""Evidence for the report's claims: one system's macro aggregate over benchmarks, accuracy
differences (paired where per-item outcomes exist), whether a run moved from its base policy, and
the gates every claim passes its verdict through (moved, like with like).

Split from :mod:`experiments.claims` so that the rules stay readable there; the report's
tables and the seeds section use the same helpers, so every number in the report has one source.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from experiments.definitions import settings_diff
from experiments.results import EvalCell, ResultsFile, pooled_tokens_mean
from experiments.rules import VerdictRules
from experiments.stats import Movement, Paired, movement, paired_macro

BASELINES, UNTRAINED = "baselines", "mas_untrained"
MAIN = "agent_gspo"


@dataclass
class Macro:
    """Aggregate of one system over a set of benchmarks."""

    accuracy: float
    se: float
    tokens_total: int
    tokens_completion: int
    n: int
    benchmarks: list[str]


def macro(cells: Mapping[str, EvalCell], benchmarks: Sequence[str]) -> Macro:
    """Macro accuracy and its standard error, summed tokens, over ``benchmarks``."""
    sel = [cells[b] for b in benchmarks]
    nb = max(1, len(sel))
    return Macro(accuracy=sum(c.accuracy for c in sel) / nb, se=math.sqrt(sum(c.accuracy_se ** 2 for c in sel)) / nb,
                 tokens_total=sum(c.tokens_total for c in sel), tokens_completion=sum(c.tokens_completion for c in sel),
                 n=sum(c.n for c in sel), benchmarks=list(benchmarks))


def cells_of(results: Mapping[str, ResultsFile], name: str, system: str = MAIN) -> dict[str, EvalCell] | None:
    res = results.get(name)
    return None if res is None else res.eval.get(system)


def compare(a: Mapping[str, EvalCell], b: Mapping[str, EvalCell]) -> tuple[Macro, Macro] | None:
    """Both sides over the benchmarks they share (None when they share none)."""
    common = [x for x in a if x in b]
    return (macro(a, common), macro(b, common)) if common else None


def items_of(results: Mapping[str, ResultsFile], name: str, system: str = MAIN) -> dict | None:
    res = results.get(name)
    return None if res is None or res.items is None else res.items.get(system)


def accuracy_difference(results: Mapping[str, ResultsFile], a: tuple[str, str], b: tuple[str, str],
                        ma: Macro, mb: Macro) -> tuple[Paired, str]:
    """a − b in accuracy: paired over shared items when both files hold per-item outcomes, else the
    unpaired macro difference (and a note saying which)."""
    ia, ib = items_of(results, *a), items_of(results, *b)
    pair = paired_macro(ia, ib) if ia and ib else None
    if pair is not None:
        return pair, f"paired over {pair.n} shared items"
    se = math.sqrt(ma.se ** 2 + mb.se ** 2)
    return (Paired(ma.accuracy - mb.accuracy, se, ma.n, tuple(ma.benchmarks)),
            "unpaired standard error (a results file holds no per-item outcomes)")


def moved(results: Mapping[str, ResultsFile], name: str, rules: VerdictRules) -> Movement:
    """Whether trained run ``name`` moved away from its base policy (stats.movement)."""
    return movement(results[name].history, items_of(results, name), items_of(results, BASELINES, UNTRAINED), rules)


def gate(status: str, runs: Sequence[tuple[str, Movement]], lines: list[str]) -> str:
    """PASS and FAIL stand only when every run compared moved; otherwise INCONCLUSIVE (a FAIL stays a
    FAIL for a single run judged against a fixed target: it did not reach it)."""
    for name, m in runs:
        lines.append(f"{name} {'moved' if m.moved else 'did not move'} from its base policy: {m.why}")
    if all(m.moved for _, m in runs):
        return status
    if len(runs) == 1 and status == "FAIL":
        return status
    lines.append("a run that did not move cannot support this comparison -> INCONCLUSIVE")
    return "INCONCLUSIVE"


def like_with_like(status: str, results: Mapping[str, ResultsFile], a: str, b: str, lines: list[str]) -> str:
    """``status``, or INCONCLUSIVE when experiments ``a`` and ``b`` ran under different settings (a run
    re-done under a new protocol is not compared with one left from the old)."""
    diff = settings_diff(results[a].settings, results[b].settings)
    if not diff:
        return status
    lines.append(f"{a} and {b} ran under different settings ({'; '.join(diff)}) -> INCONCLUSIVE until both "
                 "are run under the same profile")
    return "INCONCLUSIVE"


def series(history: Sequence[Mapping[str, float]], key: str) -> list[float]:
    return [float(h[key]) for h in history if key in h]


def last_k_mean(history: Sequence[Mapping[str, float]], key: str, k: int) -> float | None:
    xs = series(history, key)[-k:]
    return sum(xs) / len(xs) if xs else None


def spread(xs: Sequence[float]) -> float | None:
    """Population standard deviation over steps (None for fewer than two steps)."""
    return statistics.pstdev(xs) if len(xs) >= 2 else None


def collapse(res: ResultsFile, rules: VerdictRules) -> str | None:
    """Why a training run looks collapsed, or None: non-finite metrics, (near-)total silence over the
    last k steps, (nearly) every message at the message cap over the last k steps (the length
    collapse that raw negative rewards drive: every message grows until the cap stops it), or
    accuracy falling to 0 over the last k steps after being positive early on."""
    h, k, share = res.history, res.last_k, rules.collapse_share
    if any(not math.isfinite(v) for row in h for v in row.values()):
        return "non-finite metrics"
    silence = last_k_mean(h, "train/silence_rate", k)
    if silence is not None and silence >= share:
        return f"silence {silence:.2f} over the last {k} steps"
    capped = last_k_mean(h, "train/cap_hit_rate", k)
    if capped is not None and capped >= share:
        return f"messages at the cap {capped:.2f} over the last {k} steps"
    acc = series(h, "train/accuracy")
    if len(acc) >= 2 * k and sum(acc[:k]) > 0 and sum(acc[-k:]) == 0:
        return f"accuracy fell to 0 over the last {k} steps"
    return None


def fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def budget_error(res: ResultsFile) -> tuple[float, float, int] | None:
    """(last-k mean of ``train/budget_tokens``, relative error vs B, k) for a budgeted run."""
    if res.budget is None or not res.history:
        return None
    k = min(res.last_k, len(res.history))
    mean = last_k_mean(res.history, "train/budget_tokens", k)
    if mean is None:
        return None
    return mean, mean / res.budget.target - 1.0, k


def eval_budget_figure(res: ResultsFile) -> float | None:
    """The figure B was derived from (e.g. ``tokens_completion_mean`` on gsm8k), measured on the trained
    policy's evaluation with the same pooling; None without a budget or those cells."""
    cells = res.eval.get(MAIN, {})
    if res.budget is None or not all(b in cells for b in res.budget.benchmarks):
        return None
    return pooled_tokens_mean(cells, res.budget.benchmarks, res.budget.measure)


@dataclass
class Versus:
    """A trained run against the untrained MAS over the benchmarks both evaluated."""

    trained: Macro
    untrained: Macro
    diff: Paired
    """accuracy, trained − untrained"""
    how: str
    """how ``diff`` was computed (paired, or the unpaired fallback)"""
    ratio: float
    """total tokens, trained / untrained"""
    completion_ratio: float


def versus_untrained(results: Mapping[str, ResultsFile], name: str) -> Versus | None:
    """Run ``name`` against the untrained MAS (None when either is missing or they share no benchmark)."""
    base, cells = cells_of(results, BASELINES, UNTRAINED), cells_of(results, name)
    pair = compare(cells, base) if cells is not None and base is not None else None
    if pair is None:
        return None
    t, u = pair
    d, how = accuracy_difference(results, (name, MAIN), (BASELINES, UNTRAINED), t, u)
    ratio = t.tokens_total / u.tokens_total if u.tokens_total else math.inf
    comp = t.tokens_completion / u.tokens_completion if u.tokens_completion else math.inf
    return Versus(t, u, d, how, ratio, comp)
