"""MLflow tracking for Agent-GSPO: run logging with a fixed metric vocabulary, policy model
logging / registration / resolution, and the accuracy-and-tokens promotion gate."""

from components.tracking.errors import ModelUriError, PromotionError, TrackingError
from components.tracking.metric_names import METRIC_NAMES, flatten_params, is_metric_name, validate_metrics
from components.tracking.mlflow_logging import (
    Tracker,
    check_reachable,
    configure_http_retries,
    git_commit,
    log_policy_model,
    resolve_model_uri,
)
from components.tracking.promotion import PromotionDecision, promote
from components.tracking.registry import promotion_lock, version_metrics, write_eval_tags

__all__ = [
    "METRIC_NAMES", "ModelUriError", "PromotionDecision", "PromotionError", "Tracker", "TrackingError",
    "check_reachable", "configure_http_retries", "flatten_params", "git_commit", "is_metric_name",
    "log_policy_model", "promote", "promotion_lock", "resolve_model_uri", "validate_metrics",
    "version_metrics", "write_eval_tags",
]
