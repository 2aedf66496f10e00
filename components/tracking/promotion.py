"""Promotion gate: move ``@champion`` only when accuracy holds AND tokens do not grow.

Rule (the point of Agent-GSPO is the token economy, so a model that is as
accurate but more expensive must not win):

* no champion yet: the candidate becomes ``@champion`` iff accuracy >= ``min_accuracy``,
  otherwise it is ``rejected`` (no alias);
* champion C exists: the candidate becomes ``@champion`` iff
  ``acc >= acc_C - accuracy_tolerance`` and ``tokens <= tokens_C * max_token_ratio``;
  otherwise it becomes ``@challenger`` (kept for inspection / A-B, never served by default).

``tokens_total`` must be measured the same way for both (same items, same settings); pass
``champion_metrics_fn`` to re-evaluate the champion on the candidate's items instead of
trusting its stored tags. The decision, reason and numbers are written as ``promotion.*`` tags
on the candidate version. Re-running for the same candidate with the same outcome writes
nothing and returns ``unchanged``. The read-decide-write section runs under
:func:`components.tracking.registry.promotion_lock`, so concurrent promotions serialise.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from mlflow import MlflowClient

from components.tracking.backend import guarded
from components.tracking.registry import (
    LockHandle,
    LockKind,
    alias_version,
    get_version,
    normalise_metrics,
    promotion_lock,
    version_metrics,
)

Decision = Literal["champion", "challenger", "rejected", "unchanged"]
CHAMPION, CHALLENGER = "champion", "challenger"
EPS = 1e-9  # float slack so 0.51 - 0.01 >= 0.50 holds


@dataclass
class PromotionDecision:
    """What :func:`promote` decided, why, and on which numbers (also written as version tags)."""

    decision: Decision
    reason: str
    metrics_used: dict[str, float | str | None] = field(default_factory=dict)
    name: str = ""
    version: str = ""
    compared_to: str | None = None
    """Champion version the candidate was compared with (None for a first model)."""

    def summary(self) -> str:
        """One line for the CLI / Prefect artifact."""
        return f"{self.name} v{self.version}: {self.decision} - {self.reason}"


def _rule(cand: dict[str, float], champ: dict[str, float] | None, champ_version: str | None, *,
          accuracy_tolerance: float, max_token_ratio: float, min_accuracy: float) -> tuple[Decision, str]:
    acc, tok = cand["accuracy"], cand["tokens_total"]
    if champ is None:
        if acc + EPS >= min_accuracy:
            return CHAMPION, f"first model: accuracy {acc:.4f} >= min_accuracy {min_accuracy:.4f}"
        return "rejected", f"first model: accuracy {acc:.4f} < min_accuracy {min_accuracy:.4f}"
    acc_bar = champ["accuracy"] - accuracy_tolerance
    tok_bar = champ["tokens_total"] * max_token_ratio
    acc_ok, tok_ok = acc + EPS >= acc_bar, tok <= tok_bar * (1 + EPS)
    acc_text = (f"accuracy {acc:.4f} {'>=' if acc_ok else '<'} champion v{champ_version} "
                f"{champ['accuracy']:.4f} - tolerance {accuracy_tolerance:.4f}")
    tok_text = (f"tokens {tok:.1f} {'<=' if tok_ok else '>'} champion {champ['tokens_total']:.1f} "
                f"x max_token_ratio {max_token_ratio:g}")
    if acc_ok and tok_ok:
        return CHAMPION, f"{acc_text} and {tok_text}"
    failed = [t for ok, t in ((acc_ok, acc_text), (tok_ok, tok_text)) if not ok]
    return CHALLENGER, "; ".join(failed)


def promote(client: MlflowClient, name: str, candidate_version: str | int,
            candidate_metrics: Mapping[str, object] | None = None, *, accuracy_tolerance: float,
            max_token_ratio: float, min_accuracy: float,
            champion_metrics_fn: Callable[[str], Mapping[str, object]] | None = None,
            lock: LockKind = "auto", lock_timeout_s: float = 60.0) -> PromotionDecision:
    """Decide and apply the alias for ``name`` version ``candidate_version`` (see module doc).

    ``candidate_metrics``: ``{"accuracy", "tokens_total"}`` (``eval.``-prefixed keys work too);
    None reads the version's ``eval.*`` tags. ``champion_metrics_fn(version) -> metrics``
    overrides the champion's stored tags. Raises :class:`PromotionError` for a missing
    version or missing metrics, :class:`TrackingError` when the registry is unreachable.
    """
    uri = str(getattr(client, "_registry_uri", None) or client.tracking_uri)
    version = str(candidate_version)

    def _run() -> PromotionDecision:
        get_version(client, name, version)  # fail fast, before taking the lock
        cand = (normalise_metrics(dict(candidate_metrics), f"candidate {name!r} v{version} metrics")
                if candidate_metrics is not None else version_metrics(client, name, version))
        with promotion_lock(client, name, kind=lock, timeout_s=lock_timeout_s) as handle:
            return _decide_and_apply(client, name, version, cand, champion_metrics_fn, handle,
                                     accuracy_tolerance, max_token_ratio, min_accuracy)

    return guarded(uri, f"promote {name!r} v{version}", _run)


def _decide_and_apply(client: MlflowClient, name: str, version: str, cand: dict[str, float],
                      champion_metrics_fn: Callable[[str], Mapping[str, object]] | None, handle: LockHandle,
                      accuracy_tolerance: float, max_token_ratio: float,
                      min_accuracy: float) -> PromotionDecision:
    """The critical section: aliases and the candidate's promotion tags are read under the lock."""
    old_tags = get_version(client, name, version).tags
    champ_mv = alias_version(client, name, CHAMPION)
    chall_mv = alias_version(client, name, CHALLENGER)
    chall_version = str(chall_mv.version) if chall_mv is not None else None
    champ_version = str(champ_mv.version) if champ_mv is not None else None  # int on sqlite
    used: dict[str, float | str | None] = {"candidate_accuracy": cand["accuracy"],
                                           "candidate_tokens_total": cand["tokens_total"],
                                           "accuracy_tolerance": accuracy_tolerance,
                                           "max_token_ratio": max_token_ratio, "min_accuracy": min_accuracy}
    result = PromotionDecision("unchanged", "", used, name, version, champ_version)
    if champ_version == version:
        result.reason = f"already @champion ({old_tags.get('promotion.reason', 'set outside promote')})"
        return result
    champ = None
    if champ_version is not None:
        raw = (champion_metrics_fn(champ_version) if champion_metrics_fn is not None
               else version_metrics(client, name, champ_version))
        champ = normalise_metrics(dict(raw), f"champion {name!r} v{champ_version} metrics")
        used.update(champion_accuracy=champ["accuracy"], champion_tokens_total=champ["tokens_total"])
    decision, reason = _rule(cand, champ, champ_version, accuracy_tolerance=accuracy_tolerance,
                             max_token_ratio=max_token_ratio, min_accuracy=min_accuracy)
    compared = champ_version or "none"
    same_record = (old_tags.get("promotion.decision") == decision
                   and old_tags.get("promotion.compared_to") == compared)
    holds_alias = decision == "rejected" or chall_version == version
    if same_record and holds_alias and decision != CHAMPION:
        result.reason = f"already {decision} against v{compared}: {reason}"
        return result

    # Tags first, aliases last: a crash in between leaves a record that a re-run re-applies
    # (the alias check above fails), never an alias without its reason.
    handle.verify()
    tags = {"promotion.decision": decision, "promotion.reason": reason, "promotion.compared_to": compared,
            "promotion.decided_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **{f"promotion.{k}": "" if v is None else str(v) for k, v in used.items()}}
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, str(value)[:5000])
    if decision == CHAMPION:
        client.set_registered_model_alias(name, CHAMPION, version)
        if chall_version == version:
            client.delete_registered_model_alias(name, CHALLENGER)
        if champ_version is not None:
            client.set_model_version_tag(name, champ_version, "promotion.superseded_by", version)
    elif decision == CHALLENGER:
        client.set_registered_model_alias(name, CHALLENGER, version)
    return PromotionDecision(decision, reason, used, name, version, champ_version)
