"""What a registered version records about the system it serves, read back for checks.

A version logged by :func:`components.tracking.policy_model.log_policy_model` holds
:data:`components.tracking.served.SETTINGS_FILE` (artifact ``artifacts/<file>`` of the model): the
``mas`` protocol ``mlflow models serve`` runs it with. The promotion gate compares numbers measured
under the configured ``mas``; :func:`protocol_differences` says where that is not what the version
serves, so ``promote`` can warn that its decision is not about the served system.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping
from typing import Any

from components.config import MasConfig
from components.config_sections import protocol_of
from components.tracking.errors import TrackingError
from components.tracking.served import SETTINGS_FILE, read_settings
from components.tracking.versions import download_version_artifacts, registry_client

log = logging.getLogger(__name__)
SHOWN_KEYS = ("agents", "rounds", "topology", "protocol")
"""listed first in messages: what the README and the serving params name"""


def recorded_mas(name: str, version: str, *, uri: str) -> dict[str, Any] | None:
    """The ``mas`` settings ``name`` v``version`` records for serving, or None when it records none
    (a version not logged by this project) or they cannot be read (logged at INFO, never an error:
    only a warning depends on them)."""
    with tempfile.TemporaryDirectory(prefix="agent-gspo-settings-") as tmp:
        try:
            path = download_version_artifacts(registry_client(uri), name, version, tmp, uri=uri,
                                              path=f"artifacts/{SETTINGS_FILE}")
            return dict(read_settings(path)["mas"])
        except (TrackingError, ValueError, KeyError, TypeError) as exc:  # ValueError: a bad file (RequestError)
            log.info("models:/%s/%s: no recorded serving settings read (%s)", name, version, exc)
            return None


def protocol_differences(evaluated: Mapping[str, Any], recorded: Mapping[str, Any]) -> list[str]:
    """``key evaluated->recorded`` for each protocol setting that differs (the keys of ``evaluated``:
    an evaluation setting's ``protocol``; ``recorded``: a version's ``mas``, completed with today's
    defaults). The best-known keys come first."""
    served = protocol_of(MasConfig.model_validate(dict(recorded)))
    keys = [k for k in SHOWN_KEYS if k in evaluated] + sorted(k for k in evaluated if k not in SHOWN_KEYS)
    return [f"{k} {evaluated[k]}->{served.get(k)}" for k in keys if k in served and evaluated[k] != served[k]]
