"""Promotion gate: move ``@champion`` only when accuracy holds AND tokens do not grow, like with like.

The point of Agent-GSPO is the token economy, so a model that is as accurate but more expensive
must not win. Every number compared was measured under ONE evaluation setting, the gate's
(``setting_key``: benchmarks, item sample, seed, data manifest and protocol; see
:mod:`components.tracking.gate` for where the numbers live):

* the candidate must have results under that setting (:class:`CandidateNotEvaluated` otherwise);
* champion C exists: it must have results under that setting too (:class:`ChampionNotEvaluated`
  otherwise; ``agent-gspo promote --evaluate-champion`` measures it first). The candidate becomes
  ``@champion`` iff ``acc >= max(acc_C, best lineage acc) - accuracy_tolerance`` and
  ``tokens <= min(tokens_C, fewest lineage tokens) * max_token_ratio``; otherwise it becomes
  ``@challenger`` (kept for inspection / A-B, never served by default). The lineage reference is
  the best accuracy and the fewest tokens any champion reached under the setting, so repeated
  drops within the tolerance cannot ratchet accuracy down;
* no ``@champion`` but there was one (deleted version or alias): the candidate is compared with the
  lineage reference; without one under this setting the gate refuses rather than lower the bar;
* never a champion: the candidate becomes ``@champion`` iff accuracy >= ``min_accuracy``, else
  it is ``rejected`` (no alias);
* a candidate whose ``ModelVersion.status`` is not ``READY`` (registration pending or failed) is
  refused; a ``@champion`` that is not ``READY`` counts as no champion, with a warning.

Stored numbers (results and the lineage reference) must be finite, accuracies in [0, 1] and
tokens >= 0; anything else is an error naming the version or registered model and the tag.

The decision, reason, setting and numbers are written as ``promotion.*`` tags on the candidate.
Re-running for the same candidate with the same outcome writes nothing and returns ``unchanged``.
The read-decide-write section runs under :func:`components.tracking.registry.promotion_lock`,
so concurrent promotions serialise.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from mlflow import MlflowClient

from components.tracking.backend import guarded
from components.tracking.errors import PromotionError
from components.tracking.gate import (
    LAST_CHAMPION_TAG,
    GateResult,
    Reference,
    evaluated_settings,
    read_reference,
    read_result,
    write_reference,
)
from components.tracking.registry import LockHandle, LockKind, alias_version, get_version, promotion_lock

Decision = Literal["champion", "challenger", "rejected", "unchanged"]
CHAMPION, CHALLENGER = "champion", "challenger"
EPS = 1e-9  # float slack so 0.51 - 0.01 >= 0.50 holds
READY = "READY"
"""the only ModelVersion.status whose artifacts are complete (not PENDING_ / FAILED_REGISTRATION)"""
log = logging.getLogger(__name__)


class CandidateNotEvaluated(PromotionError):
    """The candidate has no evaluation under the gate's setting."""


class ChampionNotEvaluated(PromotionError):
    """The champion has no evaluation under the gate's setting (``champion`` names its version)."""

    def __init__(self, message: str, champion: str) -> None:
        super().__init__(message)
        self.champion = champion


@dataclass(frozen=True)
class GateRule:
    """``registry.*`` thresholds of the gate."""

    accuracy_tolerance: float
    max_token_ratio: float
    min_accuracy: float


@dataclass
class PromotionDecision:
    """What :func:`promote` decided, why, and on which numbers (also written as version tags)."""

    decision: Decision
    reason: str
    metrics_used: dict[str, float | str | None] = field(default_factory=dict)
    name: str = ""
    version: str = ""
    compared_to: str | None = None
    """Champion version the candidate was compared with ("reference" without a champion, None for a first model)."""
    setting: str = ""

    def summary(self) -> str:
        """One line for the CLI / Prefect artifact."""
        return f"{self.name} v{self.version}: {self.decision} - {self.reason}"


def _rule(cand: GateResult, bar: Reference | None, against: str, rule: GateRule) -> tuple[Decision, str]:
    acc, tok = cand.accuracy, cand.tokens_total
    if bar is None:
        if acc + EPS >= rule.min_accuracy:
            return CHAMPION, f"first model: accuracy {acc:.4f} >= min_accuracy {rule.min_accuracy:.4f}"
        return "rejected", f"first model: accuracy {acc:.4f} < min_accuracy {rule.min_accuracy:.4f}"
    acc_ok = acc + EPS >= bar.accuracy - rule.accuracy_tolerance
    tok_ok = tok <= bar.tokens_total * rule.max_token_ratio * (1 + EPS)
    acc_text = (f"accuracy {acc:.4f} {'>=' if acc_ok else '<'} {against} {bar.accuracy:.4f} "
                f"(v{bar.accuracy_version}) - tolerance {rule.accuracy_tolerance:.4f}")
    tok_text = (f"tokens {tok:.1f} {'<=' if tok_ok else '>'} {against} {bar.tokens_total:.1f} "
                f"(v{bar.tokens_version}) x max_token_ratio {rule.max_token_ratio:g}")
    if acc_ok and tok_ok:
        return CHAMPION, f"{acc_text} and {tok_text}"
    return CHALLENGER, "; ".join(t for ok, t in ((acc_ok, acc_text), (tok_ok, tok_text)) if not ok)


def promote(client: MlflowClient, name: str, candidate_version: str | int, *, setting_key: str, rule: GateRule,
            setting_text: str = "", champion_result_fn: Callable[[str], GateResult] | None = None,
            lock: LockKind = "auto", lock_timeout_s: float = 60.0) -> PromotionDecision:
    """Decide and apply the alias for ``name`` v``candidate_version`` under ``setting_key`` (module doc).

    ``setting_text`` describes the setting in error messages. ``champion_result_fn(version)``
    replaces the champion's stored result (e.g. a fresh measurement). Raises
    :class:`PromotionError` (missing version or results), :class:`TrackingError` (registry down).
    """
    uri = str(getattr(client, "_registry_uri", None) or client.tracking_uri)
    version = str(candidate_version)

    def _run() -> PromotionDecision:
        mv = get_version(client, name, version)  # fail fast, before taking the lock
        if str(mv.status) != READY:
            raise PromotionError(f"candidate models:/{name}/{version} has status {mv.status}, not {READY} (its "
                                 "registration did not complete): it cannot become @champion; register it again")
        tags = mv.tags
        cand = read_result(tags, setting_key, f"candidate {name!r} v{version}")
        if cand is None:
            have = ", ".join(evaluated_settings(tags)) or "none"
            raise CandidateNotEvaluated(
                f"models:/{name}/{version} has no evaluation under the gate's setting {setting_key} "
                f"({setting_text or 'see eval.* tags'}; it has: {have}); run `agent-gspo evaluate --model "
                f"models:/{name}/{version}` with the same --profile/--set/--limit first")
        with promotion_lock(client, name, kind=lock, timeout_s=lock_timeout_s) as handle:
            return _decide_and_apply(client, name, version, cand, setting_key, setting_text, champion_result_fn,
                                     handle, rule)

    return guarded(uri, f"promote {name!r} v{version}", _run)


def _champion_bar(client: MlflowClient, name: str, key: str, text: str, champ_version: str | None,
                  champion_result_fn: Callable[[str], GateResult] | None) -> tuple[Reference | None, str]:
    """What the candidate must match: champion and lineage merged, the lineage alone, or nothing."""
    model_tags = client.get_registered_model(name).tags
    ref = read_reference(model_tags, key, f"registered model {name!r}")
    if champ_version is None:
        last = model_tags.get(LAST_CHAMPION_TAG)
        if last is None:
            return None, "none"
        if ref is None:
            raise PromotionError(f"{name!r} has no @champion (v{last} was the last one; its version or alias is "
                                 f"gone) and no reference under setting {key} ({text}): set @champion again or "
                                 f"evaluate a former champion under this setting, rather than lower the bar")
        return ref, "reference"
    if champion_result_fn is not None:
        champ = champion_result_fn(champ_version)
    else:
        champ = read_result(get_version(client, name, champ_version).tags, key, f"champion {name!r} v{champ_version}")
    if champ is None:
        raise ChampionNotEvaluated(
            f"champion models:/{name}/{champ_version} has no evaluation under the gate's setting {key} ({text}); "
            f"run `agent-gspo evaluate --model models:/{name}/{champ_version}` with the same --profile/--set/--limit, "
            f"or `agent-gspo promote --evaluate-champion`", champ_version)
    merged = ref.merged(champ_version, champ) if ref is not None else Reference.of(champ_version, champ)
    return merged, champ_version


def _decide_and_apply(client: MlflowClient, name: str, version: str, cand: GateResult, key: str, text: str,
                      champion_result_fn: Callable[[str], GateResult] | None, handle: LockHandle,
                      rule: GateRule) -> PromotionDecision:
    """The critical section: aliases, references and the candidate's promotion tags are read under the lock."""
    old_tags = get_version(client, name, version).tags
    champ_mv = alias_version(client, name, CHAMPION)
    if champ_mv is not None and str(champ_mv.status) != READY:
        log.warning("warning: @champion of %r is v%s with status %s, not %s: treated as no champion (the "
                    "lineage reference, if any, still sets the bar)", name, champ_mv.version, champ_mv.status, READY)
        champ_mv = None
    chall_mv = alias_version(client, name, CHALLENGER)
    chall_version = str(chall_mv.version) if chall_mv is not None else None
    champ_version = str(champ_mv.version) if champ_mv is not None else None  # int on sqlite
    used: dict[str, float | str | None] = {"candidate_accuracy": cand.accuracy,
                                           "candidate_tokens_total": cand.tokens_total,
                                           "accuracy_tolerance": rule.accuracy_tolerance,
                                           "max_token_ratio": rule.max_token_ratio, "min_accuracy": rule.min_accuracy}
    result = PromotionDecision("unchanged", "", used, name, version, champ_version, key)
    if champ_version == version:
        result.reason = f"already @champion ({old_tags.get('promotion.reason', 'set outside promote')})"
        return result
    bar, compared = _champion_bar(client, name, key, text, champ_version, champion_result_fn)
    against = "champion" if compared not in ("none", "reference") else "lineage reference"
    if bar is not None:
        used.update(bar_accuracy=bar.accuracy, bar_accuracy_version=bar.accuracy_version,
                    bar_tokens_total=bar.tokens_total, bar_tokens_version=bar.tokens_version)
    decision, reason = _rule(cand, bar, against, rule)
    same_record = (old_tags.get("promotion.decision") == decision and old_tags.get("promotion.compared_to") == compared
                   and old_tags.get("promotion.setting") == key)
    holds_alias = decision == "rejected" or chall_version == version
    if same_record and holds_alias and decision != CHAMPION:
        result.reason = f"already {decision} against {compared}: {reason}"
        result.compared_to = None if compared == "none" else compared
        return result

    # Tags first, aliases last: a crash in between leaves a record that a re-run re-applies
    # (the alias check above fails), never an alias without its reason.
    handle.verify()
    tags = {"promotion.decision": decision, "promotion.reason": reason, "promotion.compared_to": compared,
            "promotion.setting": key, "promotion.decided_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **{f"promotion.{k}": "" if v is None else str(v) for k, v in used.items()}}
    for tag, value in tags.items():
        client.set_model_version_tag(name, version, tag, str(value)[:5000])
    if decision == CHAMPION:
        lineage = bar.merged(version, cand) if bar is not None else Reference.of(version, cand)
        write_reference(client, name, key, lineage, version)
        client.set_registered_model_alias(name, CHAMPION, version)
        if chall_version == version:
            client.delete_registered_model_alias(name, CHALLENGER)
        if champ_version is not None:
            client.set_model_version_tag(name, champ_version, "promotion.superseded_by", version)
    elif decision == CHALLENGER:
        client.set_registered_model_alias(name, CHALLENGER, version)
    return PromotionDecision(decision, reason, used, name, version, None if compared == "none" else compared, key)
