"""``models:/`` URIs to registry versions, with one-line errors and a bounded wait.

Every command that takes a registered model (evaluate, promote, the model download) resolves it
here, so a wrong name, version or alias fails the same way everywhere: a
:class:`ModelUriError` (exit 2) in one line that says what exists instead. The client is opened
through :func:`registry_client`, which bounds MLflow's HTTP retries and probes an ``http(s)://``
server first, so an unreachable registry fails within seconds instead of MLflow's default
minutes of retries.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException

from components.io import file_sha256, write_json_atomic
from components.redact import redact
from components.tracking.backend import check_reachable, configure_http_retries, guarded
from components.tracking.errors import ModelUriError, TrackingError

log = logging.getLogger(__name__)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
"""files whose bytes are the policy's weights (their digest is recorded at registration)"""
REGISTERED_FILE = "registered_model.json"
"""Written into a trained policy folder once it is registered: evaluating the folder then records
the results on that version (what the DVC pipeline does)."""
MODELS_URI_RE = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[\w\-]+)|/(?P<version>[0-9]+))?$")
MAX_VERSION = 2**63 - 1
"""the registry stores versions as 64-bit integers"""
MISSING = ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND")
SHOWN = 8
USERINFO_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://)[^/?#]*@")


@dataclass(frozen=True)
class VersionRef:
    """One registered model version (``name``, ``version`` as a string)."""

    name: str
    version: str

    @property
    def uri(self) -> str:
        """``models:/<name>/<version>``: pins the version (an alias may move later)."""
        return f"models:/{self.name}/{self.version}"


def registry_client(uri: str) -> MlflowClient:
    """A client on ``uri`` (tracking and registry) that fails fast when the server is down.

    Every caller reads a registry that must already hold models, so a ``sqlite:///`` database that
    does not exist is an error here, not an empty database created as a side effect of a lookup.
    """
    if uri.startswith("sqlite:///") and uri != "sqlite:///:memory:":
        db = Path(uri[len("sqlite:///"):].split("?", 1)[0])
        if not db.is_file():
            raise TrackingError(f"no MLflow database at {db} (tracking.uri {uri}): nothing is registered there; "
                                "train first, or point tracking.uri / $MLFLOW_TRACKING_URI at your registry")
    configure_http_retries()
    check_reachable(uri)
    return guarded(uri, "open the registry", lambda: MlflowClient(tracking_uri=uri, registry_uri=uri))


def download_version_artifacts(client: MlflowClient, name: str, version: str, dst: str | Path, *, uri: str,
                               path: str = "") -> str:
    """Download ``path`` (default: the whole model) of ``name`` v``version`` into ``dst``; the local path.

    Not through a ``models:/`` URI: MLflow resolves those with a client on the *global* registry URI
    (``ModelsArtifactRepository``), whatever ``registry_uri`` is passed, and that global falls back to
    ``sqlite:///mlflow.db``. Against a remote registry this read another registry (the version "not
    found") and left an empty ``mlflow.db`` in the working folder. Here the version's artifact location
    comes from ``client`` (the configured registry) and is downloaded with the tracking URI ``uri``.
    """
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    def _download() -> str:
        root = str(client.get_model_version_download_uri(name, str(version)))
        return get_artifact_repository(root, tracking_uri=uri).download_artifacts(path, dst_path=str(dst))

    return guarded(uri, f"download models:/{name}/{version}{'/' + path if path else ''}", _download)


def parse_models_uri(text: str) -> tuple[str, str | None, str | None]:
    """``(name, version, alias)`` of ``models:/<name>[/<version>|@<alias>]``; at most one of the last two."""
    match = MODELS_URI_RE.match(text)
    if match is None:
        raise ModelUriError(f"model {text!r}: expected models:/<name>, models:/<name>/<version> or "
                            f"models:/<name>@<alias> (stages are not used; use aliases such as @champion)")
    if match["version"] is not None and not 1 <= int(match["version"]) <= MAX_VERSION:
        raise ModelUriError(f"model {text!r}: no version {match['version']} (registry versions count from 1)")
    return match["name"], match["version"], match["alias"]


def _listing(items: list[str]) -> str:
    shown = ", ".join(items[:SHOWN]) + (f", ... ({len(items)} in all)" if len(items) > SHOWN else "")
    return shown or "none"


def _not_found(client: MlflowClient, uri: str, text: str, name: str, version: str | None,
               alias: str | None) -> ModelUriError:
    """The one-line error for a models:/ URI the registry does not know, naming what it does know."""
    try:
        model = client.get_registered_model(name)
    except MlflowException as exc:
        if exc.error_code not in MISSING:
            raise
        names = [m.name for m in client.search_registered_models(max_results=50)]
        return ModelUriError(f"model {text!r}: no registered model {name!r} in the registry at {uri} "
                             f"(registered: {_listing(names)})")
    if alias is not None:
        known = [f"@{a} -> v{v}" for a, v in sorted(model.aliases.items())]
        return ModelUriError(f"model {text!r}: {name!r} has no alias @{alias} (aliases: {_listing(known)})")
    versions = sorted(int(v.version) for v in client.search_model_versions(f"name='{name}'"))
    if version is None:
        return ModelUriError(f"model {text!r}: {name!r} has no versions yet (train first: agent-gspo train)")
    return ModelUriError(f"model {text!r}: {name!r} has no version {version} "
                         f"(versions: {_listing([str(v) for v in versions])})")


def get_model_version(client: MlflowClient, text: str, *, uri: str) -> ModelVersion:
    """The registry entry behind ``text`` (newest version when neither a version nor an alias is given)."""
    name, version, alias = parse_models_uri(text)

    def _lookup() -> ModelVersion:
        try:
            if alias is not None:
                return client.get_model_version_by_alias(name, alias)
            if version is not None:
                return client.get_model_version(name, version)
            found = client.search_model_versions(f"name='{name}'")
        except MlflowException as exc:
            if exc.error_code in MISSING:
                raise _not_found(client, uri, text, name, version, alias) from None
            raise
        if not found:
            raise _not_found(client, uri, text, name, None, None)
        return max(found, key=lambda mv: int(mv.version))

    return guarded(uri, f"resolve {text}", _lookup)


def resolve_version(text: str, *, uri: str, client: MlflowClient | None = None) -> VersionRef:
    """``models:/...`` -> :class:`VersionRef`; aliases and "newest" are resolved now, once."""
    mv = get_model_version(client or registry_client(uri), text, uri=uri)
    return VersionRef(mv.name, str(mv.version))


def registry_identity(uri: str) -> str:
    """``uri`` without its credentials: the user-info (``user:password@``) dropped and secret query
    values masked (:func:`components.redact.redact`). Two spellings of one registry compare equal
    whether the password is in the URI or in ``$MLFLOW_TRACKING_PASSWORD``."""
    return USERINFO_RE.sub(r"\1", redact(uri))


def weights_sha256(folder: str | Path) -> str:
    """sha256 over the weight files of a policy folder (:data:`WEIGHT_SUFFIXES`, at any depth): of the
    listing "relative path, sha256 of its bytes" in path order: the weights a registration stands for."""
    root = Path(folder)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    listing = "".join(f"{p.relative_to(root).as_posix()}\0{file_sha256(p)}\n" for p in files)
    return hashlib.sha256(listing.encode()).hexdigest()


def write_registration(folder: str | Path, ref: VersionRef, *, uri: str, run_id: str | None) -> Path:
    """Record in a policy folder which registry version it became (see :data:`REGISTERED_FILE`), with
    the digest of its weights (:func:`weights_sha256`), so that a copy with other weights is not
    taken for that version.

    The URI is stored redacted: the folder is a pipeline output that gets copied and shared."""
    path = Path(folder) / REGISTERED_FILE
    write_json_atomic(path, {"name": ref.name, "version": ref.version, "tracking_uri": redact(uri),
                             "run_id": run_id, "weights_sha256": weights_sha256(folder)})
    return path


def registration_of(folder: str | Path, *, uri: str) -> VersionRef | None:
    """The version a policy folder was registered as in the registry at ``uri``, when it still is.

    None when the folder holds no registration, names another registry, its weights are not the
    ones registered (edited or swapped after registration; folders registered before the digest was
    recorded are taken at their word), or the version is gone or comes from another run (a
    re-created database): the folder is then just a folder.
    """
    path = Path(folder) / REGISTERED_FILE
    if not path.is_file():
        return None
    rec = json.loads(path.read_text())
    if registry_identity(str(rec.get("tracking_uri"))) != registry_identity(uri):
        return None
    recorded = rec.get("weights_sha256")
    if recorded is not None and recorded != weights_sha256(folder):
        log.warning("%s: its weights are not those registered as models:/%s/%s (sha256 differs): evaluated as "
                    "a plain folder, nothing is recorded on that version", folder, rec.get("name"), rec.get("version"))
        return None
    client = registry_client(uri)
    try:
        mv = get_model_version(client, f"models:/{rec['name']}/{rec['version']}", uri=uri)
    except ModelUriError:
        return None
    if rec.get("run_id") and mv.run_id != rec["run_id"]:
        return None
    return VersionRef(mv.name, str(mv.version))
