"""Log a saved HF policy folder as an MLflow model, register it, and resolve model URIs back.

The model is an MLflow pyfunc (see :mod:`components.tracking.hf_pyfunc` for why not the
transformers flavour) whose ``hf_model`` artifact is the untouched HF folder. Requirements
are pinned explicitly from the installed versions, so MLflow never imports the model to infer
them (which is what makes ``mlflow.pytorch.log_model`` slow) and nothing touches the network.
"""

from __future__ import annotations

import hashlib
import os
import re
import warnings
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import mlflow
import yaml
from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.models.signature import ModelSignature
from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

from components.io import atomic_dir
from components.tracking.backend import check_reachable, configure_http_retries, git_commit, guarded
from components.tracking.errors import ModelUriError

PYFUNC_CODE = Path(__file__).with_name("hf_pyfunc.py")
ARTIFACT_KEY = "hf_model"
GIT_COMMIT_TAG = "git.commit"
REQUIREMENTS = ("torch", "transformers", "tokenizers", "safetensors")
MODELS_URI_RE = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[\w\-]+)|/(?P<version>\d+))$")
HF_ID_RE = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")
DEFAULT_CACHE = "~/.cache/agent-gspo/registry"
_COMPLETE = ".agent-gspo-complete"


def _pinned_requirements() -> list[str]:
    """``pkg==X.Y.Z`` for the installed packages, local labels (``+cpu``) dropped."""
    reqs = []
    for pkg in REQUIREMENTS:
        try:
            reqs.append(f"{pkg}=={metadata.version(pkg).split('+', 1)[0]}")
        except metadata.PackageNotFoundError:
            reqs.append(pkg)
    return reqs


def _check_hf_folder(folder: Path, what: str) -> None:
    if not folder.is_dir():
        raise ModelUriError(f"{what}: {folder} is not a folder")
    if not ((folder / "config.json").exists() or (folder / "adapter_config.json").exists()):
        raise ModelUriError(f"{what}: {folder} has no config.json / adapter_config.json "
                            f"(expected a folder written by save_pretrained)")


def log_policy_model(model_dir: Path, *, registered_name: str, tags: Mapping[str, Any],
                     tracking_uri: str | None = None, artifact_name: str = "policy") -> ModelVersion:
    """Log ``model_dir`` (HF model + tokenizer) as an MLflow model and register a new version.

    ``tags`` go on the model version (data manifest hash, config hash, ...); ``git.commit`` is
    added from :func:`git_commit` when absent. Logs into the active run if there is one.
    Returns the new ``ModelVersion`` (status READY). ~1 s for a tiny model on sqlite.
    """
    model_dir = Path(model_dir)
    _check_hf_folder(model_dir, "log_policy_model")
    uri = tracking_uri or mlflow.get_tracking_uri()
    configure_http_retries()
    check_reachable(uri)
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    version_tags = {str(k): str(v) for k, v in tags.items()}
    if GIT_COMMIT_TAG not in version_tags and (sha := git_commit()):
        version_tags[GIT_COMMIT_TAG] = sha
    signature = ModelSignature(
        inputs=Schema([ColSpec("string")]), outputs=Schema([ColSpec("string")]),
        params=ParamSchema([ParamSpec("max_new_tokens", "long", 64),
                            ParamSpec("temperature", "double", 0.0)]))

    def _log() -> ModelVersion:
        with warnings.catch_warnings():  # an input example would load the model at log time
            warnings.filterwarnings("ignore", message=".*input example was not provided.*")
            info = mlflow.pyfunc.log_model(
                name=artifact_name, python_model=str(PYFUNC_CODE), artifacts={ARTIFACT_KEY: str(model_dir)},
                pip_requirements=_pinned_requirements(), signature=signature)
        return mlflow.register_model(info.model_uri, registered_name, tags=version_tags)

    return guarded(uri, f"log and register {model_dir} as {registered_name!r}", _log)


def _hf_folder_in(root: Path) -> Path:
    """Locate the HF folder inside a downloaded MLflow model (ours, or a transformers flavour)."""
    mlmodel = root / "MLmodel"
    if mlmodel.exists():
        spec = yaml.safe_load(mlmodel.read_text()) or {}
        artifacts = spec.get("flavors", {}).get("python_function", {}).get("artifacts", {})
        if ARTIFACT_KEY in artifacts:
            return root / artifacts[ARTIFACT_KEY]["path"]
    if (root / "model" / "config.json").exists():  # mlflow.transformers layout
        tok = root / "components" / "tokenizer"
        for item in tok.iterdir() if tok.is_dir() else []:
            target = root / "model" / item.name
            if not target.exists():
                target.write_bytes(item.read_bytes())
        return root / "model"
    raise ModelUriError(f"{root}: downloaded model holds no HF folder (no '{ARTIFACT_KEY}' artifact)")


def resolve_model_uri(uri: str | os.PathLike[str], *, dst_dir: str | os.PathLike[str] | None = None,
                      tracking_uri: str | None = None) -> Path | str:
    """Turn a model reference into something ``from_pretrained`` accepts.

    * an existing local folder -> ``Path`` (must hold config.json or adapter_config.json);
    * ``models:/<name>@<alias>`` or ``models:/<name>/<version>`` -> the alias is resolved to a
      version first, its artifacts are downloaded once into
      ``<dst_dir or $AGENT_GSPO_MODEL_CACHE or ~/.cache/agent-gspo/registry>/<name>/<version>-<key>``
      (key: hash of the registry URI and the version's source run)
      (atomically; re-used afterwards) and the HF folder inside is returned as ``Path``;
    * anything shaped like a hub id (``org/name``) -> returned unchanged as ``str``.
    Raises :class:`ModelUriError` for a missing folder / model / alias, :class:`TrackingError`
    when the registry is unreachable.
    """
    text = os.fspath(uri)
    local = Path(text).expanduser()
    if local.exists():
        _check_hf_folder(local, f"model {text!r}")
        return local
    if text.startswith("models:/"):
        return _download_registered(text, dst_dir, tracking_uri)
    if HF_ID_RE.match(text) and not text.startswith((".", "~")):
        return text
    raise ModelUriError(f"model {text!r}: no such folder, and not a models:/<name>@<alias>, "
                        f"models:/<name>/<version> URI or a hub id")


def _download_registered(text: str, dst_dir: str | os.PathLike[str] | None, tracking_uri: str | None) -> Path:
    match = MODELS_URI_RE.match(text)
    if not match:
        raise ModelUriError(f"model {text!r}: expected models:/<name>@<alias> or models:/<name>/<version> "
                            f"(stages are not used; use aliases such as @champion)")
    uri = tracking_uri or mlflow.get_tracking_uri()
    configure_http_retries()
    check_reachable(uri)
    client = MlflowClient(tracking_uri=uri, registry_uri=tracking_uri)
    name, alias, version = match["name"], match["alias"], match["version"]

    def _version() -> ModelVersion:
        try:
            if alias:
                return client.get_model_version_by_alias(name, alias)
            return client.get_model_version(name, version)
        except MlflowException as exc:
            if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
                raise ModelUriError(
                    f"model {text!r} not found in the registry at {uri}: {exc.message}") from exc
            raise

    mv = guarded(uri, f"resolve {text}", _version)
    cache = Path(dst_dir or os.environ.get("AGENT_GSPO_MODEL_CACHE", DEFAULT_CACHE)).expanduser()
    # "<name>/<version>" alone is not an identity: every registry has its own version 1. Key the
    # download by the registry and the version's source run too, so another registry's (or a
    # re-created database's) version 1 is never served from this cache.
    ident = hashlib.sha256(f"{uri}|{mv.run_id}|{mv.source}".encode()).hexdigest()[:16]
    target = cache / re.sub(r"[^\w.\-]", "_", name) / f"{mv.version}-{ident}"
    if not (target / _COMPLETE).exists():
        with atomic_dir(target) as staging:
            guarded(uri, f"download {text}", lambda: mlflow.artifacts.download_artifacts(
                artifact_uri=f"models:/{name}/{mv.version}", dst_path=str(staging),
                tracking_uri=uri, registry_uri=tracking_uri))
            (staging / _COMPLETE).write_text(f"{name}/{mv.version}\n")
    folder = _hf_folder_in(target)
    _check_hf_folder(folder, f"model {text!r}")
    return folder
