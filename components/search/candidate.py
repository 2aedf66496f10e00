"""Does the search's best trial beat the current parameters beyond noise? Only then is it a candidate.

The baseline is the profile the search ran under, without any of the search's overrides, put
through the same trial function (the same short training and the same seeded dev items) once per
study; its per-item results are kept in the study (user attribute :data:`STUDY_BASELINE`), every
trial's in its own user attribute :data:`ATTR_ITEMS`, so any worker of the study can decide.
The decision is :func:`components.comparison.paired_verdict` (best vs baseline) under the rule of
``registry.gate`` (the promotion gate's, so both judge alike): a tie (two trials with
identical results, every trial at accuracy 0), noise, or fewer items than the rule's ``min_items``
never win, and then the best-parameters file is left as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial

from components.comparison import ComparisonRule, IncomparableItems, ItemScore, PairedVerdict, paired_verdict
from components.config import Config
from components.redact import redact
from components.search.errors import SearchError

ATTR_ITEMS = "search:items"
"""trial user attribute: {benchmark: [[item id, correct, tokens_total], ...]} on the dev items"""
STUDY_BASELINE = "search:baseline"
"""study user attribute: the baseline's dev accuracy, mean tokens and items (same layout as ATTR_ITEMS)"""

Items = Mapping[str, Sequence[ItemScore]]


@dataclass(frozen=True)
class BaselineTrial:
    """Stands in for the ``optuna.Trial`` a trial function gets, when it evaluates the baseline."""

    number: str = "baseline"
    params: dict[str, Any] | None = None


@dataclass(frozen=True)
class Decision:
    """Whether the best trial becomes the candidate, and the one line that says why."""

    wins: bool
    reason: str
    verdict: PairedVerdict | None = None


def comparison_rule(cfg: Config) -> ComparisonRule:
    """The promotion gate's rule (``registry.gate``): a search's best must pass what a candidate must."""
    return cfg.registry.gate.rule()


def items_to_attr(items: Items) -> dict[str, list[list[Any]]]:
    """Per-item results as JSON for a user attribute (Optuna stores attributes as JSON)."""
    return {bench: [[s.id, bool(s.correct), float(s.tokens_total)] for s in scores] for bench, scores in items.items()}


def items_from_attr(raw: Any, where: str) -> dict[str, list[ItemScore]]:
    """The inverse of :func:`items_to_attr`; :class:`SearchError` naming ``where`` when malformed."""
    try:
        return {str(bench): [ItemScore(str(i), bool(c), float(t)) for i, c, t in rows] for bench, rows in raw.items()}
    except (AttributeError, TypeError, ValueError) as exc:
        raise SearchError(f"{where}: per-item results are malformed ({exc})") from exc


def baseline_items(study: Any, cfg: Config, trial_fn: Callable[[Config, Any], Any]) -> dict[str, list[ItemScore]]:
    """The baseline's per-item results, evaluated once per study (later workers and reruns read them)."""
    raw = study.user_attrs.get(STUDY_BASELINE)
    if raw is None:
        outcome = trial_fn(cfg, BaselineTrial())
        if getattr(outcome, "items", None) is None:
            raise SearchError("search: the trial function reported no per-item results for the baseline "
                              "(TrialOutcome.items); the best trial cannot be compared with the current parameters")
        raw = {"dev_accuracy": float(outcome.dev_accuracy),
               "mean_tokens_per_episode": float(outcome.mean_tokens_per_episode),
               "tokens_spent": int(outcome.tokens_spent), "items": items_to_attr(outcome.items)}
        study.set_user_attr(STUDY_BASELINE, raw)
    return items_from_attr(raw["items"], f"study {study.study_name!r}: the baseline")


def judge(study: Any, cfg: Config, trial_fn: Callable[[Config, Any], Any], best: FrozenTrial) -> Decision:
    """:func:`decide` against the study's baseline (evaluated now if no worker has yet). A baseline that
    fails to evaluate (an OOM, a tracking outage) decides nothing: the best trial is no candidate."""
    try:
        baseline = baseline_items(study, cfg, trial_fn)
    except Exception as exc:  # noqa: BLE001 - any failure of the trial function, as a trial's would be
        return Decision(False, f"the profile's parameters could not be evaluated for the comparison "
                               f"({type(exc).__name__}: {redact(str(exc))[:300]})")
    return decide(best, baseline, comparison_rule(cfg))


def decide(best: FrozenTrial, baseline: Items, rule: ComparisonRule) -> Decision:
    """Best trial vs baseline under ``rule``: it wins only when ``paired_verdict`` says better or cheaper."""
    raw = best.user_attrs.get(ATTR_ITEMS)
    if raw is None:
        return Decision(False, f"trial {best.number} reported no per-item results, so it cannot be compared "
                               "with the current parameters")
    try:
        verdict = paired_verdict(items_from_attr(raw, f"trial {best.number}"), baseline, rule)
    except IncomparableItems as exc:
        return Decision(False, f"trial {best.number} and the baseline are not comparable: {exc}")
    return Decision(verdict.wins, f"trial {best.number} vs the profile's parameters: {verdict.reason}", verdict)
