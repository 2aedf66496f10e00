"""Errors of the tracking package; all are :class:`UserError` (the CLI exits 2 with the message)."""

from __future__ import annotations

from components.errors import UserError


class TrackingError(UserError):
    """The MLflow tracking / registry backend failed or is unreachable; the message names the URI."""


class ModelUriError(UserError):
    """A model folder or ``models:/`` URI that does not exist or does not hold an HF model."""


class PromotionError(UserError):
    """Promotion cannot decide: missing version, missing metrics, or the registry lock timed out."""


class RegistryRefusal(TrackingError):
    """The tracking server or registry answered and refused the request (a 4xx, e.g.
    ``INVALID_PARAMETER_VALUE``, ``RESOURCE_ALREADY_EXISTS``, ``PERMISSION_DENIED``): the same request
    fails the same way again, so it is an error at once, never retried as an outage."""
