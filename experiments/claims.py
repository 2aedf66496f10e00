"""The report's "Claims" section: the paper's token-economy claims (a)-(e) and the project's target
(f) checked against the results files, with the runs of record in their roles (``experiments.record``,
:class:`components.config.RecordConfig`); the evidence helpers live in :mod:`experiments.evidence`.

Every claim is computed from the numbers (never typed), names the experiments it compares, and
is PASS / FAIL, INCONCLUSIVE when the runs exist but cannot decide it, or NOT RUN when an
experiment it needs has no results file. The rules (:mod:`experiments.stats`):

* accuracy differences are paired over the items both sides answered (macro over the shared
  benchmarks); files written before per-item outcomes were recorded fall back to the unpaired
  ``sqrt(se_a² + se_b²)`` and the evidence says so;
* a claim never PASSes on a trained run that did not move away from its base policy, and a claim
  that compares two trained runs (b, d, e) is INCONCLUSIVE unless both moved;
* budget tracking (c) is judged over the last >= 64 training episodes, two-sided, and a run inside
  the band counts only if λ_tok had settled there (not clipped, not still sweeping), else INCONCLUSIVE;
* two experiments run under different settings (:data:`.definitions.SETTINGS_KEYS`: model, agents,
  rounds, message cap, context, item sample) are not comparable: INCONCLUSIVE, whatever the numbers.

Tokens are the evaluation's total tokens (prompt + completion, what a provider bills: the
paper's figure).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from experiments.definitions import settings_diff
from experiments.evidence import (
    BASELINES,
    MAIN,
    UNTRAINED,
    accuracy_difference,
    budget_error,
    cells_of,
    collapse,
    compare,
    eval_budget_figure,
    fmt,
    gate,
    last_k_mean,
    like_with_like,
    moved,
    series,
    spread,
    versus_untrained,
)
from experiments.report_collapse import claim_collapse
from experiments.results import ResultsFile
from experiments.rules import rules_of
from experiments.schema import RecordConfig as Record
from experiments.stats import controller_settled, last_episodes, rule_at_endings
from experiments.verdicts import chance_caveat, is_v2, ni_line, ni_test, ni_title

Status = Literal["PASS", "FAIL", "INCONCLUSIVE", "NOT RUN", "REPORTED"]
"""REPORTED: numbers shown with no verdict (the claim has no target)"""
LAMBDA0_LIKE_FOR_LIKE = {"lambda0_answer": "gspo_b25_answer", "lambda0_mix_answer": "gspo_b25_mix_answer"}
"""λ = 0 runs made under a budgeted variant's own recipe (training sources, prior, guards): claim (b) shows
each pair as evidence, not counted (the claim is about the run of record, B25)"""
BOTH_COLLAPSED = "both runs collapsed: neither is a stable run to compare the other with -> INCONCLUSIVE"


@dataclass
class Claim:
    key: str
    title: str
    status: Status
    evidence: list[str] = field(default_factory=list)


DEFAULT_RECORD = Record(rules="v1")
"""the paper's names in every role (``experiments.record`` left at its defaults), judged by the rules
``v1`` (the version every committed report was judged by; a caller with a config passes its record)"""


def claim_a(results: Mapping[str, ResultsFile], record: Record = DEFAULT_RECORD) -> Claim:
    """PASS when at least one Agent-GSPO run (B25, B50) is within one SE of the untrained MAS's accuracy
    (or above) at <= 25 % of its total tokens; each run's numbers are listed either way."""
    rules = rules_of(record.rules)
    title = (f"Trained MAS accuracy within one standard error of (or above) the free-for-all MAS at no more "
             f"than {rules.token_share:g} of its tokens")
    if is_v2(rules):
        title = (f"Trained MAS accuracy {ni_title(rules)} to the free-for-all MAS at no more than "
                 f"{rules.token_share:g} of its tokens")
    base = cells_of(results, BASELINES, UNTRAINED)
    trained = record.trained
    runs = [(n, c) for n in trained if (c := cells_of(results, n)) is not None]
    if base is None or not runs:  # a folder of variants alone (e.g. a sensitivity set) still shows them
        return Claim("a", title, "NOT RUN", [f"needs {BASELINES} and one of {', '.join(trained)}",
                                             *_budgeted_variants(results, record)])
    lines, verdicts = [], []
    for name, _ in runs:
        v = versus_untrained(results, name)
        if v is None:
            lines.append(f"{name}: no benchmark in common with {BASELINES}")
            continue
        t, u, d, how, ratio, comp = v.trained, v.untrained, v.diff, v.how, v.ratio, v.completion_ratio
        ni = ni_test(results, (name, MAIN), (BASELINES, UNTRAINED), rules) if is_v2(rules) else None
        ok = (ni is not None and ni.passed if is_v2(rules) else d.not_below(rules.se_margin)) \
            and ratio <= rules.token_share
        lines.append(f"{name}: accuracy {t.accuracy:.3f} vs {u.accuracy:.3f} "
                     f"(difference {d.diff:+.3f}, SE {d.se:.3f}, {how}); total tokens {t.tokens_total} vs "
                     f"{u.tokens_total} = {ratio:.2f}x (needs <= {rules.token_share:g}x; completion tokens "
                     f"{comp:.2f}x) "
                     f"-> {'meets' if ok else 'misses'} the claim")
        untestable = is_v2(rules) and ni is None
        if is_v2(rules):
            lines += [ni_line(f"{name} to the untrained MAS", ni, u.accuracy),
                      *chance_caveat(results, [(name, MAIN), (BASELINES, UNTRAINED)], rules),
                      *claim_collapse(results, name, MAIN, rules)]
        status = "INCONCLUSIVE" if untestable and ratio <= rules.token_share else "PASS" if ok else "FAIL"
        verdicts.append(like_with_like(gate(status, [(name, moved(results, name, rules))], lines),
                                       results, name, BASELINES, lines))
    lines += _budgeted_variants(results, record)
    if not verdicts:
        return Claim("a", title, "FAIL", lines)
    status = "PASS" if "PASS" in verdicts else "INCONCLUSIVE" if "INCONCLUSIVE" in verdicts else "FAIL"
    return Claim("a", title, status, lines)


def _budgeted_variants(results: Mapping[str, ResultsFile], record: Record) -> list[str]:
    """Evidence lines, not counted, for every other budgeted Agent-GSPO recipe (``gspo_*`` files with a
    budget: the variants that change training sources, prior or guards): the same paired accuracy
    difference and token ratios as the runs of record, with no verdict. Claim (a) stays about B25 and
    B50, whose recipe was fixed before any of them ran; a variant picked after seeing results would
    not be a test of the claim."""
    rules = rules_of(record.rules)
    lines: list[str] = []
    for name in sorted(results):
        res = results[name]
        if not name.startswith("gspo_") or name in record.trained or res.budget is None:
            continue
        v = versus_untrained(results, name)
        if v is None:
            continue
        lines.append(f"variant, not counted: {name}: accuracy {v.trained.accuracy:.3f} vs {v.untrained.accuracy:.3f} "
                     f"(difference {v.diff.diff:+.3f}, SE {v.diff.se:.3f}, {v.how}); total tokens "
                     f"{v.trained.tokens_total} vs {v.untrained.tokens_total} = {v.ratio:.2f}x (completion tokens "
                     f"{v.completion_ratio:.2f}x); {moved(results, name, rules).why}")
        lines += claim_collapse(results, name, MAIN, rules) if is_v2(rules) else []
    return lines


def claim_b(results: Mapping[str, ResultsFile], record: Record = DEFAULT_RECORD) -> Claim:
    """Evaluation total tokens of λ = 0 against the budgeted run of record (B25, else B50); the
    training-side ratio (budget measure, last k steps) is shown as supporting evidence."""
    rules = rules_of(record.rules)
    title = f"λ = 0 uses at least {rules.lambda0_ratio:g}x the tokens of the budgeted run"
    lam = record.lambda0
    free = cells_of(results, lam)
    budgeted = next(((n, c) for n in record.trained if (c := cells_of(results, n)) is not None), None)
    if free is None or budgeted is None:
        return Claim("b", title, "NOT RUN", [f"needs {lam} and one of {', '.join(record.trained)}",
                                             *_like_for_like_lambda0(results, record)])
    pair = compare(free, budgeted[1])
    if pair is None:
        return Claim("b", title, "NOT RUN", [f"{lam} and {budgeted[0]} share no benchmark"])
    f, b = pair
    ratio = f.tokens_total / b.tokens_total if b.tokens_total else math.inf
    lines = [f"evaluation total tokens: {lam} {f.tokens_total} vs {budgeted[0]} {b.tokens_total} = {ratio:.2f}x "
             f"(completion tokens {f.tokens_completion} vs {b.tokens_completion})"]
    h0, hb = results[lam].history, results[budgeted[0]].history
    k = min(results[lam].last_k, len(h0) or 1, len(hb) or 1)
    m0, mb = last_k_mean(h0, "train/budget_tokens", k), last_k_mean(hb, "train/budget_tokens", k)
    if m0 is not None and mb:
        lines.append(f"training, last {k} steps, tokens/episode (budget measure): {m0:.1f} vs {mb:.1f} "
                     f"= {m0 / mb:.2f}x")
    lines.append(f"accuracy: {f.accuracy:.3f} vs {b.accuracy:.3f}")
    status = gate("PASS" if ratio >= rules.lambda0_ratio else "FAIL",
                  [(lam, moved(results, lam, rules)), (budgeted[0], moved(results, budgeted[0], rules))], lines)
    status = like_with_like(status, results, lam, budgeted[0], lines)
    return Claim("b", title, status, lines + _like_for_like_lambda0(results, record))


def _like_for_like_lambda0(results: Mapping[str, ResultsFile], record: Record) -> list[str]:
    """Evidence lines for each :data:`LAMBDA0_LIKE_FOR_LIKE` pair with both results files (not counted;
    a pair that is the record's own λ=0 and B25 is the claim itself, not evidence beside it)."""
    rules = rules_of(record.rules)
    lines: list[str] = []
    for free_name, budgeted_name in LAMBDA0_LIKE_FOR_LIKE.items():
        if (free_name, budgeted_name) == (record.lambda0, record.b25):
            continue
        free, budgeted = cells_of(results, free_name), cells_of(results, budgeted_name)
        pair = compare(free, budgeted) if free is not None and budgeted is not None else None
        if pair is None:
            continue
        f, b = pair
        ratio = f"{f.tokens_total / b.tokens_total:.2f}x" if b.tokens_total else "inf"
        diff = settings_diff(results[free_name].settings, results[budgeted_name].settings)
        same = "same settings" if not diff else f"different settings ({', '.join(diff)})"
        lines.append(f"same recipe, not counted: {free_name} {f.tokens_total} vs {budgeted_name} {b.tokens_total} "
                     f"= {ratio} (needs >= {rules.lambda0_ratio:g}x; {same}); accuracy {f.accuracy:.3f} vs "
                     f"{b.accuracy:.3f}; {free_name} {moved(results, free_name, rules).why}")
    return lines


def _held_out_line(name: str, res: ResultsFile) -> list[str]:
    held_out = eval_budget_figure(res)
    if held_out is None or res.budget is None:
        return []
    b = res.budget
    return [f"{name}, held-out evaluation (greedy, not counted): {b.measure} tokens per item on "
            f"{', '.join(b.benchmarks)} {held_out:.1f} vs B {b.target:.1f} = {held_out / b.target - 1:+.1%}; "
            f"B = {b.fraction:g} x {b.baseline_mean:.1f} ({b.figure}, {b.system})"]


def claim_c(results: Mapping[str, ResultsFile], record: Record = DEFAULT_RECORD) -> Claim:
    """Every Agent-GSPO run (B25, B50) within ±10 % of its B; the ablations that also carry a budget are
    listed but not counted (tracking is the method's claim, not the ablations')."""
    rules = rules_of(record.rules)
    title = (f"Mean tokens tracked the budget B within ±{rules.budget_tolerance:.0%} (two-sided) over the last "
             f">= {rules.window} training episodes, held by the controller")
    lines: list[str] = []
    verdicts: list[bool | None] = []
    for name, res in results.items():
        if res.budget is None or not res.history:
            continue
        counted = name in record.trained
        mean, n = last_episodes(res.history, "train/budget_tokens", rules.window)
        if mean is None or n < rules.window:
            # too few episodes to PASS; a miss that every one of the last k steps shows on the same
            # side of the band is still a FAIL (no noise explains it)
            k = min(res.last_k, len(res.history))
            steps = series(res.history, "train/budget_tokens")[-k:]
            rel_steps = [x / res.budget.target - 1.0 for x in steps]
            missed = bool(rel_steps) and (all(r > rules.budget_tolerance for r in rel_steps)
                                          or all(r < -rules.budget_tolerance for r in rel_steps))
            lines.append(f"{name}: {n} training episodes with counts, fewer than {rules.window}; last {k} steps "
                         f"{', '.join(f'{x:.1f}' for x in steps)} vs B {res.budget.target:.1f} -> "
                         + ("every step outside the band on the same side: a miss" if missed else "cannot judge")
                         + ("" if counted else " (not counted)"))
            if counted:
                verdicts.append(False if missed else None)
            lines.extend(_held_out_line(name, res))
            continue
        rel = mean / res.budget.target - 1.0
        ok = abs(rel) <= rules.budget_tolerance
        settled, settle_why = controller_settled(res.history, rules) if ok else (True, "")
        if counted:
            verdicts.append(ok if settled else None)
        lines.append(f"{name}: last {n} episodes mean {mean:.1f} vs B {res.budget.target:.1f} ({res.budget.measure} "
                     f"tokens) = {rel:+.1%} -> {'within' if ok else 'outside'}" + ("" if counted else " (not counted)"))
        if not settled:
            lines.append(f"{name}: {settle_why}: inside the band, but not held by λ")
        if counted and (endings := rule_at_endings(res.history, res.budget.target, rules.budget_tolerance, rules)):
            lines.append(f"{name}: {endings.text()}")
        lines.extend(_held_out_line(name, res))
    if not verdicts:
        return Claim("c", title, "NOT RUN", lines or [f"needs a trained, budgeted {' or '.join(record.trained)}"])
    if False in verdicts:
        return Claim("c", title, "FAIL", lines)
    return Claim("c", title, "INCONCLUSIVE" if None in verdicts else "PASS", lines)


def claim_d(results: Mapping[str, ResultsFile], record: Record = DEFAULT_RECORD) -> Claim:
    """no_adv_norm against gspo_b25 (its parent: only advantage normalisation differs). The paper gives
    no threshold, so the verdict is a majority over the indicators that separate the runs: reward
    spread over steps (when the two differ by more than ``spread_margin`` of the larger), evaluation
    accuracy (when the difference exceeds its standard error), and collapse (when only one run
    collapsed). No separating indicator -> INCONCLUSIVE: a tiny run must not read as evidence."""
    rules = rules_of(record.rules)
    title = "Advantage normalisation matters for stability"
    b25, off_name = record.b25, record.no_adv_norm
    ref, off = results.get(b25), results.get(off_name)
    if ref is None or off is None or not ref.history or not off.history:
        return Claim("d", title, "NOT RUN", [f"needs {b25} and {off_name} (trained)"])
    votes: list[bool] = []
    lines = []
    rs = [spread(series(r.history, "train/reward")) for r in (ref, off)]
    accs = [spread(series(r.history, "train/accuracy")) for r in (ref, off)]
    grads = [last_k_mean(r.history, "gspo/grad_norm", len(r.history)) for r in (ref, off)]
    lines.append(f"std of train/reward over steps: normalised {fmt(rs[0])} vs off {fmt(rs[1])}; "
                 f"std of train/accuracy: {fmt(accs[0])} vs {fmt(accs[1])}; mean grad norm {fmt(grads[0])} vs "
                 f"{fmt(grads[1])}")
    if None not in rs and abs(rs[0] - rs[1]) > rules.spread_margin * max(rs):  # type: ignore[operator,type-var]
        votes.append(rs[0] <= rs[1])  # type: ignore[operator]
    pair = compare(ref.eval.get(MAIN, {}), off.eval.get(MAIN, {}))
    if pair is not None:
        d, how = accuracy_difference(results, (b25, MAIN), (off_name, MAIN), *pair)
        lines.append(f"evaluation accuracy: normalised {pair[0].accuracy:.3f} vs off {pair[1].accuracy:.3f} "
                     f"(difference {d.diff:+.3f}, SE {d.se:.3f}, {how})")
        if is_v2(rules):  # separates when the one-sided bounds of the paired difference exclude 0
            ni = ni_test(results, (b25, MAIN), (off_name, MAIN), rules)
            if ni is not None and (ni.difference.low > 0 or ni.difference.high < 0):
                votes.append(ni.difference.low > 0)
            lines.append("accuracy separates the runs only when the one-sided "
                         f"{rules.ni_confidence:.0%} bounds of the paired difference exclude 0: "
                         + ("no per-item outcomes to pair" if ni is None else
                            f"[{ni.difference.low:+.4f}, {ni.difference.high:+.4f}] -> "
                            + ("separates" if ni.difference.low > 0 or ni.difference.high < 0 else
                               "does not separate")))
        elif abs(d.diff) > rules.se_margin * d.se:
            votes.append(d.diff >= 0)
    cs = [collapse(ref, rules), collapse(off, rules)]
    lines.append(f"collapse: normalised {cs[0] or 'none'}; off {cs[1] or 'none'}")
    if cs[0] is not None and cs[1] is not None:
        lines.append(BOTH_COLLAPSED)
        return Claim("d", title, "INCONCLUSIVE", lines)
    if (cs[0] is None) != (cs[1] is None):
        votes.append(cs[0] is None)
    if not votes:
        acc_why = ("accuracy bounds include 0" if is_v2(rules) else "accuracy within one standard error")
        lines.append(f"no indicator separates the runs (reward spreads within {rules.spread_margin:.0%}, {acc_why}, "
                     "no collapse): the runs are too small to tell")
        return Claim("d", title, "INCONCLUSIVE", lines)
    lines.append(f"no hard threshold: PASS when the normalised run is better on most of the {len(votes)} "
                 f"separating indicator(s) ({sum(votes)} of {len(votes)})")
    status = gate("PASS" if sum(votes) * 2 > len(votes) else "FAIL",
                  [(b25, moved(results, b25, rules)), (off_name, moved(results, off_name, rules))], lines)
    return Claim("d", title, like_with_like(status, results, b25, off_name, lines), lines)


def claim_e(results: Mapping[str, ResultsFile], record: Record = DEFAULT_RECORD) -> Claim:
    """grpo_token against gspo_b25 (same settings, token-level ratios): accuracy decides, budget tracking
    and reward spread are shown alongside. Two collapsed runs (e.g. both silent) are INCONCLUSIVE: their
    accuracies tie whatever the ratio level, a non-inferiority check that cannot fail."""
    rules = rules_of(record.rules)
    title = "Sequence-level GSPO vs token-level (GRPO-style) ratios at the same settings"
    b25, tok_name = record.b25, record.grpo_token
    seq, tok = results.get(b25), results.get(tok_name)
    if seq is None or tok is None or MAIN not in seq.eval or MAIN not in tok.eval:
        return Claim("e", title, "NOT RUN", [f"needs {b25} and {tok_name}"])
    pair = compare(seq.eval[MAIN], tok.eval[MAIN])
    if pair is None:
        return Claim("e", title, "NOT RUN", [f"{b25} and {tok_name} share no benchmark"])
    s, t = pair
    d, how = accuracy_difference(results, (b25, MAIN), (tok_name, MAIN), s, t)
    lines = [f"accuracy: GSPO {s.accuracy:.3f} vs token-level {t.accuracy:.3f} "
             f"(difference {d.diff:+.3f}, SE {d.se:.3f}, {how}); total tokens {s.tokens_total} vs {t.tokens_total}"]
    errs = [budget_error(r) for r in (seq, tok)]
    if None not in errs:
        lines.append(f"budget tracking error: GSPO {errs[0][1]:+.1%} vs token-level {errs[1][1]:+.1%}")  # type: ignore[index]
    rs = [spread(series(r.history, "train/reward")) for r in (seq, tok)]
    lines.append(f"std of train/reward over steps: GSPO {fmt(rs[0])} vs token-level {fmt(rs[1])}")
    if is_v2(rules):
        ni = ni_test(results, (b25, MAIN), (tok_name, MAIN), rules)
        lines += [f"PASS when GSPO is {ni_title(rules)} to token-level (lower bound above -{rules.ni_margin:g})",
                  ni_line(f"{b25} to {tok_name}", ni, t.accuracy),
                  *chance_caveat(results, [(b25, MAIN), (tok_name, MAIN)], rules),
                  *claim_collapse(results, b25, MAIN, rules), *claim_collapse(results, tok_name, MAIN, rules)]
        verdict = "INCONCLUSIVE" if ni is None else "PASS" if ni.passed else "FAIL"
    else:
        lines.append("PASS when GSPO's accuracy is within one standard error of (or above) token-level's")
        verdict = "PASS" if d.not_below(rules.se_margin) else "FAIL"
    cs = [collapse(seq, rules), collapse(tok, rules)]
    if cs[0] is not None and cs[1] is not None:  # two degenerate policies tie on accuracy whatever the ratio
        lines += [f"collapse: GSPO {cs[0]}; token-level {cs[1]}", BOTH_COLLAPSED]
        return Claim("e", title, "INCONCLUSIVE", lines)
    status = gate(verdict,
                  [(b25, moved(results, b25, rules)), (tok_name, moved(results, tok_name, rules))], lines)
    return Claim("e", title, like_with_like(status, results, b25, tok_name, lines), lines)


def claim_f(results: Mapping[str, ResultsFile], record: Record = DEFAULT_RECORD) -> Claim:
    """The project's target (looser than the paper's (a)): the budgeted run of record B25 at no more
    than ``target_share`` (:mod:`.rules`) of the untrained MAS's total tokens, its macro accuracy not lower by
    more than one paired standard error. One run against a fixed target: it must have moved."""
    rules = rules_of(record.rules)
    title = (f"Agent-GSPO B25 at no more than {rules.target_share:g}x the free-for-all MAS's total tokens, accuracy "
             "not lower by more than one standard error (the project's target)")
    if is_v2(rules):
        title = (f"Agent-GSPO B25 at no more than {rules.target_share:g}x the free-for-all MAS's total tokens, "
                 f"accuracy {ni_title(rules)} (the project's target)")
    name = record.b25
    v = versus_untrained(results, name)
    if v is None:
        return Claim("f", title, "NOT RUN", [f"needs {BASELINES} and {name}, sharing a benchmark"])
    ni = ni_test(results, (name, MAIN), (BASELINES, UNTRAINED), rules) if is_v2(rules) else None
    ok = (ni is not None and ni.passed if is_v2(rules) else v.diff.not_below(rules.se_margin)) \
        and v.ratio <= rules.target_share
    lines = [f"{name}: total tokens {v.trained.tokens_total} vs {v.untrained.tokens_total} = {v.ratio:.2f}x (needs "
             f"<= {rules.target_share:g}x; completion tokens {v.completion_ratio:.2f}x); accuracy "
             f"{v.trained.accuracy:.3f} "
             f"vs {v.untrained.accuracy:.3f} (difference {v.diff.diff:+.3f}, SE {v.diff.se:.3f}, {v.how}) -> "
             f"{'meets' if ok else 'misses'} the target"]
    verdict = "PASS" if ok else "FAIL"
    if is_v2(rules):
        lines += [ni_line(f"{name} to the untrained MAS", ni, v.untrained.accuracy),
                  *chance_caveat(results, [(name, MAIN), (BASELINES, UNTRAINED)], rules),
                  *claim_collapse(results, name, MAIN, rules)]
        verdict = "INCONCLUSIVE" if ni is None and v.ratio <= rules.target_share else verdict
    status = gate(verdict, [(name, moved(results, name, rules))], lines)
    return Claim("f", title, like_with_like(status, results, name, BASELINES, lines), lines)


def all_claims(results: Mapping[str, ResultsFile], record: Record = DEFAULT_RECORD) -> list[Claim]:
    return [claim(results, record) for claim in (claim_a, claim_b, claim_c, claim_d, claim_e, claim_f)]
