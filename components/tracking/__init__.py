"""MLflow tracking for Agent-GSPO: run logging with a fixed metric vocabulary, the policy logged as
the multi-agent system it was trained as, registry versions and URIs, and the promotion gate.

The names below load on first use (as in :mod:`components.jobs`): most modules here import mlflow
(~4 s), which ``components.tracking.errors`` and ``components.tracking.metric_names`` (what a
search without a tracker or a grader needs) do not.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "ModelUriError": "errors", "PromotionError": "errors", "TrackingError": "errors",
    "EvidenceMismatch": "gate", "GateResult": "gate", "read_result": "gate", "write_result": "gate",
    "METRIC_NAMES": "metric_names", "flatten_params": "metric_names", "is_metric_name": "metric_names",
    "validate_metrics": "metric_names",
    "Tracker": "mlflow_logging", "check_reachable": "mlflow_logging", "configure_http_retries": "mlflow_logging",
    "git_commit": "mlflow_logging", "log_policy_model": "mlflow_logging", "resolve_model_uri": "mlflow_logging",
    "Resume": "mlflow_logging",
    "CandidateNotEvaluated": "promotion", "ChampionNotEvaluated": "promotion", "GateRule": "promotion",
    "GateSpec": "promotion",
    "PromotionDecision": "promotion", "promote": "promotion",
    "promotion_lock": "registry",
    "Trust": "signing", "UntrustedRecord": "signing", "load_key": "signing", "trust_for": "signing",
    "VersionRef": "versions", "registry_client": "versions", "resolve_version": "versions",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> object:
    if name not in _WHERE:
        raise AttributeError(f"module 'components.tracking' has no attribute {name!r}")
    return getattr(importlib.import_module(f"components.tracking.{_WHERE[name]}"), name)
