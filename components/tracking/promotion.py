"""Promotion gate: ``@champion`` moves only on per-item evidence that the candidate is better or cheaper.

The point of Agent-GSPO is the token economy, so the gate asks the paired question of
:func:`components.comparison.paired_verdict` (the one rule every crowning decision uses): on the
SAME items, is the candidate more accurate beyond noise (``better``), or as accurate within the
margin and cheaper beyond noise (``cheaper``)? Every number comes from a verified per-item record
(:func:`components.tracking.gate.load_evidence`), never from a version's editable tags:

* the candidate must have an evaluation under the gate's setting (:class:`CandidateNotEvaluated`);
  its run must be signed under the configured key (:mod:`components.tracking.signing`; else
  :class:`~components.tracking.signing.UntrustedRecord`, exit 2 naming the run and why), its
  record's sha256 must match the run's immutable param, and its ``eval.<key>.*`` tags must say
  what the record says (:class:`~components.tracking.gate.EvidenceMismatch`, exit 2, both values);
* the reference is the ``@champion`` (READY) version; without the alias, the newest version the
  decision history crowned (:mod:`components.tracking.decision_log`, signed runs only, and the
  versions' ``promotion.*`` tags; a deleted crowned version is represented by its logged
  evaluation run). A reference without a per-item record under the setting, or whose record is
  not signed under the key, is :class:`ChampionNotEvaluated` (``promote --evaluate-champion``
  measures it on the same items);
* ``better`` / ``cheaper``: the candidate becomes ``@champion``; ``tie`` / ``worse`` /
  ``costlier``: ``@challenger`` (the champion stays); ``too_few`` items or items that are not the
  same: ``refused``, nothing is written, and the reason is one line;
* no champion ever (history empty): a first model needs ``min_items`` items and accuracy >=
  ``registry.min_accuracy`` (``champion``); fewer items: ``refused``; lower accuracy: ``rejected``.

The decision, its reason, the rule's thresholds, the intervals and the evidence (evaluation runs,
sha256s) are written as ``promotion.*`` tags on the candidate and as a run of the decision log.
Re-running for the same candidate with the same outcome writes nothing and returns ``unchanged``.
The read-decide-write section runs under :func:`components.tracking.registry.promotion_lock`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

from mlflow import MlflowClient

from components.comparison import ComparisonRule, IncomparableItems, PairedVerdict, paired_verdict
from components.tracking.backend import guarded
from components.tracking.decision_log import Entry, crownings, now_iso, record_decision
from components.tracking.errors import PromotionError
from components.tracking.gate import (
    Evidence,
    EvidenceMismatch,
    NoItemRecord,
    check_tags,
    evaluated_settings,
    load_evidence,
    read_result,
)
from components.tracking.registry import LockHandle, LockKind, alias_version, get_version, promotion_lock
from components.tracking.signing import Trust, UntrustedRecord

Decision = Literal["champion", "challenger", "rejected", "refused", "unchanged"]
CHAMPION, CHALLENGER = "champion", "challenger"
READY = "READY"
"""the only ModelVersion.status whose artifacts are complete (not PENDING_ / FAILED_REGISTRATION)"""
log = logging.getLogger(__name__)


class CandidateNotEvaluated(PromotionError):
    """The candidate has no evaluation under the gate's setting."""


class ChampionNotEvaluated(PromotionError):
    """The champion has no per-item record under the gate's setting (``champion`` names its version)."""

    def __init__(self, message: str, champion: str) -> None:
        super().__init__(message)
        self.champion = champion


@dataclass(frozen=True)
class GateRule:
    """``registry.gate`` (the paired rule) and ``registry.min_accuracy`` (a first model's bar)."""

    comparison: ComparisonRule
    min_accuracy: float = 0.0
    test: str = "paired_t"

    def describe(self) -> str:
        return f"{self.comparison.describe()}; a first model needs accuracy >= {self.min_accuracy:g}"

    def params(self) -> dict[str, str]:
        c = self.comparison
        return {"rule.test": self.test, "rule.confidence": f"{c.confidence:g}", "rule.margin": f"{c.margin:g}",
                "rule.token_factor": f"{c.token_factor:g}", "rule.max_token_ratio": f"{c.max_token_ratio:g}",
                "rule.min_items": str(c.min_items), "rule.min_accuracy": f"{self.min_accuracy:g}"}


@dataclass
class PromotionDecision:
    """What :func:`promote` decided, why, and on which evidence (also written as version tags)."""

    decision: Decision
    reason: str
    metrics_used: dict[str, float | str | None] = field(default_factory=dict)
    name: str = ""
    version: str = ""
    compared_to: str | None = None
    """reference version (None for a first model)"""
    setting: str = ""
    rule: str = ""
    verdict: PairedVerdict | None = None

    def summary(self) -> str:
        """One line for logs and the Prefect artifact."""
        return f"{self.name} v{self.version}: {self.decision} - {self.reason}"

    def block(self) -> str:
        """What ``agent-gspo promote`` prints: the rule, the intervals and the decision (one line when refused)."""
        if self.decision == "refused":
            return self.summary()
        lines = [f"{self.name} v{self.version} under setting {self.setting}", f"  rule: {self.rule}"]
        v = self.verdict
        if v is not None:
            lines += [f"  compared with v{self.compared_to} on {v.n} paired items ({', '.join(v.accuracy.benchmarks)})",
                      f"  accuracy difference: {v.accuracy.text()}",
                      f"  tokens: {v.token_ratio:.3f}x the champion's; per item minus the token factor x its: "
                      f"{v.tokens.text('.1f')}"]
        why = self.reason.split("; ", 1)[0] if v is not None else self.reason  # the intervals are printed above
        lines.append(f"  decision: {self.decision} - {why}")
        return "\n".join(lines)


def _evidence(client: MlflowClient, name: str, version: str, key: str, trust: Trust, role: str) -> Evidence | None:
    """The version's verified record under ``key`` with its tags checked against it; None when it has none."""
    where = f"{role} models:/{name}/{version}"
    tags = get_version(client, name, version).tags
    result = read_result(tags, key, where)
    if result is None or not result.run_id:
        return None
    try:
        evidence = load_evidence(client, result.run_id, where, key=key, version_uri=f"models:/{name}/{version}",
                                 trust=trust)
    except NoItemRecord:
        return None
    check_tags(result, evidence, key, where)
    return evidence


@dataclass(frozen=True)
class GateSpec:
    """What the gate decides under: the evaluation setting's key (and its description, for
    messages) whose per-item records it compares, the rule deciding, and the signing key records
    must be signed under (the default :class:`Trust` has no key: it accepts no record)."""

    setting_key: str
    rule: GateRule
    setting_text: str = ""
    trust: Trust = Trust()


def promote(client: MlflowClient, name: str, candidate_version: str | int, *, gate: GateSpec,
            lock: LockKind = "auto", lock_timeout_s: float = 60.0) -> PromotionDecision:
    """Decide and apply the alias for ``name`` v``candidate_version`` under ``gate`` (module doc).

    Raises :class:`PromotionError` (missing version, evaluation or evidence; edited tags),
    :class:`TrackingError` (registry down)."""
    uri = str(getattr(client, "_registry_uri", None) or client.tracking_uri)
    version = str(candidate_version)
    setting_key, setting_text = gate.setting_key, gate.setting_text

    def _run() -> PromotionDecision:
        mv = get_version(client, name, version)  # fail fast, before taking the lock
        if str(mv.status) != READY:
            raise PromotionError(f"candidate models:/{name}/{version} has status {mv.status}, not {READY} (its "
                                 "registration did not complete): it cannot become @champion; register it again")
        cand = _evidence(client, name, version, setting_key, gate.trust, "candidate")
        if cand is None:
            have = ", ".join(evaluated_settings(mv.tags)) or "none"
            raise CandidateNotEvaluated(
                f"models:/{name}/{version} has no evaluation with a per-item record under the gate's setting "
                f"{setting_key} ({setting_text or 'see eval.* tags'}; it has: {have}); run `agent-gspo evaluate "
                f"--model models:/{name}/{version}` with the same --profile/--set/--limit first")
        with promotion_lock(client, name, kind=lock, timeout_s=lock_timeout_s) as handle:
            return _decide_and_apply(client, name, version, cand, gate, handle)

    return guarded(uri, f"promote {name!r} v{version}", _run)


def _history(client: MlflowClient, name: str, exclude: str, trust: Trust) -> list[tuple[str, str | None]]:
    """Crowned versions, newest first, as ``(version, logged evaluation run or None)``: the decision
    log's signed crownings, then versions tagged ``promotion.decision = champion`` (by decision time)."""
    out: dict[str, str | None] = {}
    for c in crownings(client, name, trust):
        out.setdefault(c.version, c.eval_run_id or None)
    tagged = [mv for mv in client.search_model_versions(f"name = '{name}'")
              if mv.tags.get("promotion.decision") == CHAMPION]
    for mv in sorted(tagged, key=lambda mv: mv.tags.get("promotion.decided_at", ""), reverse=True):
        out.setdefault(str(mv.version), None)
    return [(v, run) for v, run in out.items() if v != exclude]


def _reference(client: MlflowClient, name: str, version: str, gate: GateSpec,
               champ_version: str | None) -> tuple[Evidence | None, str | None]:
    """The verified record the candidate is paired with and its version; (None, None) for a first model."""
    key, text = gate.setting_key, gate.setting_text
    if champ_version is None:
        history = _history(client, name, version, gate.trust)
        if not history:
            return None, None
        champ_version, logged_run = history[0]
        try:
            get_version(client, name, champ_version)
        except PromotionError:  # the crowned version is gone: its logged evaluation still is the bar
            if not logged_run:
                raise PromotionError(f"{name!r} has no @champion; v{champ_version} was the last one crowned but is "
                                     f"deleted and left no evaluation under setting {key} ({text}): set @champion "
                                     "on a version with a per-item record rather than lower the bar") from None
            log.warning("warning: %r has no @champion; pairing with the logged evaluation run %s of v%s (the last "
                        "crowned version, deleted)", name, logged_run, champ_version)
            return load_evidence(client, logged_run, f"former champion v{champ_version}", key=key,
                                 version_uri=None, trust=gate.trust), champ_version
        log.warning("warning: %r has no @champion; pairing with v%s, the last version the decision history "
                    "crowned", name, champ_version)
    try:
        evidence = _evidence(client, name, champ_version, key, gate.trust, "champion")
    except UntrustedRecord as exc:  # like no record: --evaluate-champion measures it again, signed
        raise ChampionNotEvaluated(f"{exc}, or run `agent-gspo promote --evaluate-champion`", champ_version) from None
    if evidence is None:
        raise ChampionNotEvaluated(
            f"champion models:/{name}/{champ_version} has no per-item record under the gate's setting {key} ({text}); "
            f"run `agent-gspo evaluate --model models:/{name}/{champ_version}` with the same --profile/--set/--limit, "
            f"or `agent-gspo promote --evaluate-champion`", champ_version)
    return evidence, champ_version


def _judge(cand: Evidence, ref: Evidence | None, rule: GateRule) -> tuple[Decision, str, PairedVerdict | None]:
    if ref is None:
        need = rule.comparison.min_items
        if cand.n < need:
            return "refused", f"first model: too few items ({cand.n} < min_items {need}); nothing decided", None
        if cand.accuracy + 1e-9 >= rule.min_accuracy:
            return CHAMPION, (f"first model: accuracy {cand.accuracy:.4f} >= min_accuracy {rule.min_accuracy:.4f} "
                              f"on {cand.n} items"), None
        return "rejected", f"first model: accuracy {cand.accuracy:.4f} < min_accuracy {rule.min_accuracy:.4f}", None
    try:
        verdict = paired_verdict(cand.scores, ref.scores, rule.comparison)
    except IncomparableItems as exc:
        return "refused", f"incomparable items: {exc}", None
    if verdict.outcome == "too_few":
        return "refused", verdict.reason, verdict
    return (CHAMPION if verdict.wins else CHALLENGER), verdict.reason, verdict


def _decide_and_apply(client: MlflowClient, name: str, version: str, cand: Evidence, gate: GateSpec,
                      handle: LockHandle) -> PromotionDecision:
    """The critical section: aliases, history and the candidate's promotion tags are read under the lock."""
    key, rule = gate.setting_key, gate.rule
    old_tags = get_version(client, name, version).tags
    champ_mv = alias_version(client, name, CHAMPION)
    if champ_mv is not None and str(champ_mv.status) != READY:
        log.warning("warning: @champion of %r is v%s with status %s, not %s: treated as no champion (the "
                    "decision history still sets the bar)", name, champ_mv.version, champ_mv.status, READY)
        champ_mv = None
    chall_mv = alias_version(client, name, CHALLENGER)
    chall_version = str(chall_mv.version) if chall_mv is not None else None
    champ_version = str(champ_mv.version) if champ_mv is not None else None  # int on sqlite
    used: dict[str, float | str | None] = {"candidate_accuracy": cand.accuracy,
                                           "candidate_tokens_total": cand.tokens_total, "candidate_n": cand.n,
                                           "candidate_eval_run_id": cand.run_id, "candidate_items_sha256": cand.sha256}
    result = PromotionDecision("unchanged", "", used, name, version, champ_version, key, rule.describe())
    if champ_version == version:
        result.reason = f"already @champion ({old_tags.get('promotion.reason', 'set outside promote')})"
        return result
    if champ_version is not None and champ_version not in {v for v, _ in _history(client, name, "", gate.trust)}:
        log.warning("warning: @champion of %r is v%s, which no promotion decision crowned (the alias was set by "
                    "hand): the candidate is paired with it all the same", name, champ_version)
    ref, compared = _reference(client, name, version, gate, champ_version)
    if ref is not None:
        used.update(champion_accuracy=ref.accuracy, champion_tokens_total=ref.tokens_total, champion_n=ref.n,
                    champion_eval_run_id=ref.run_id, champion_items_sha256=ref.sha256)
    decision, reason, verdict = _judge(cand, ref, rule)
    if verdict is not None:
        used.update(outcome=verdict.outcome, accuracy_diff=verdict.accuracy.mean, accuracy_low=verdict.accuracy.low,
                    accuracy_high=verdict.accuracy.high, token_ratio=verdict.token_ratio, paired_items=verdict.n)
    decided = PromotionDecision(decision, reason, used, name, version, compared, key, rule.describe(), verdict)
    if decision == "refused":
        return decided
    compared_tag = compared or "none"
    same_record = (old_tags.get("promotion.decision") == decision and old_tags.get("promotion.setting") == key
                   and old_tags.get("promotion.compared_to") == compared_tag)
    if same_record and (decision == "rejected" or chall_version == version):
        decided.decision, decided.reason = "unchanged", f"already {decision} against {compared_tag}: {reason}"
        return decided

    # Tags and the decision log first, aliases last: a crash in between leaves a record that a
    # re-run re-applies (the alias check above fails), never an alias without its reason.
    handle.verify()
    tags = {"promotion.decision": decision, "promotion.reason": reason, "promotion.compared_to": compared_tag,
            "promotion.setting": key, "promotion.decided_at": now_iso(), **rule.params(),
            **{f"promotion.{k}": "" if v is None else str(v) for k, v in used.items()}}
    tags = {(k if k.startswith("promotion.") else f"promotion.{k}"): v for k, v in tags.items()}
    for tag, value in tags.items():
        client.set_model_version_tag(name, version, tag, str(value)[:5000])
    record_decision(client, name, Entry(version, decision, reason, {
        "setting": key, "compared_to": compared_tag, "eval_run_id": cand.run_id, "items_sha256": cand.sha256,
        "champion_eval_run_id": ref.run_id if ref else "", "outcome": verdict.outcome if verdict else "first_model",
        **rule.params()}), gate.trust.key)
    if decision == CHAMPION:
        client.set_registered_model_alias(name, CHAMPION, version)
        if chall_version == version:
            client.delete_registered_model_alias(name, CHALLENGER)
        if champ_version is not None:
            client.set_model_version_tag(name, champ_version, "promotion.superseded_by", version)
    elif decision == CHALLENGER:
        client.set_registered_model_alias(name, CHALLENGER, version)
    return decided


__all__ = ["CandidateNotEvaluated", "ChampionNotEvaluated", "EvidenceMismatch", "GateRule", "PromotionDecision",
           "promote"]
