"""MLflow tracking for Agent-GSPO: run logging with a fixed metric vocabulary, the policy logged as
the multi-agent system it was trained as, registry versions and URIs, and the promotion gate."""

from components.tracking.errors import ModelUriError, PromotionError, TrackingError
from components.tracking.gate import EvidenceMismatch, GateResult, read_result, write_result
from components.tracking.metric_names import METRIC_NAMES, flatten_params, is_metric_name, validate_metrics
from components.tracking.mlflow_logging import (
    Tracker,
    check_reachable,
    configure_http_retries,
    git_commit,
    log_policy_model,
    resolve_model_uri,
)
from components.tracking.promotion import (
    CandidateNotEvaluated,
    ChampionNotEvaluated,
    GateRule,
    PromotionDecision,
    promote,
)
from components.tracking.registry import promotion_lock
from components.tracking.versions import VersionRef, registry_client, resolve_version

__all__ = [
    "METRIC_NAMES", "CandidateNotEvaluated", "ChampionNotEvaluated", "EvidenceMismatch", "GateResult", "GateRule",
    "ModelUriError",
    "PromotionDecision", "PromotionError", "Tracker", "TrackingError", "VersionRef", "check_reachable",
    "configure_http_retries", "flatten_params", "git_commit", "is_metric_name", "log_policy_model", "promote",
    "promotion_lock", "read_result", "registry_client", "resolve_model_uri", "resolve_version", "validate_metrics",
    "write_result",
]
