"""Log a trained policy as an MLflow model of the multi-agent system, register it, resolve URIs back.

The model is an MLflow pyfunc (see :mod:`components.tracking.hf_pyfunc`) with two artifacts: the
untouched HF policy folder (``hf_model``) and the settings it was trained with (``system``, see
:mod:`components.tracking.served`), plus the ``components`` package as code, so the served
system runs the recorded protocol with the code that trained it. The signature documents the
request (``question``, optional ``answer_type`` / ``choices``), the response (answer, transcript,
token counts) and the params with the trained values as defaults; an input example of that request
is saved with it (:data:`INPUT_EXAMPLE`, shown on the registry page). Requirements are pinned from
the installed versions, so MLflow never imports the model to infer them and nothing touches the
network.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import mlflow
import yaml
from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.models.signature import ModelSignature
from mlflow.types.schema import AnyType, Array, ColSpec, Object, ParamSchema, ParamSpec, Property, Schema

from components.io import atomic_dir
from components.tracking.backend import check_reachable, configure_http_retries, git_commit, guarded
from components.tracking.errors import ModelUriError
from components.tracking.served import SETTINGS_FILE
from components.tracking.versions import download_version_artifacts, get_model_version, parse_models_uri

PYFUNC_CODE = Path(__file__).with_name("hf_pyfunc.py")
PACKAGE_DIR = Path(__file__).resolve().parents[1]
ARTIFACT_KEY = "hf_model"
SETTINGS_KEY = "system"
GIT_COMMIT_TAG = "git.commit"
REQUIREMENTS = ("torch", "transformers", "tokenizers", "safetensors", "pydantic", "pyyaml", "pandas", "math-verify")
HF_ID_RE = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")
DEFAULT_CACHE = "~/.cache/agent-gspo/registry"
_COMPLETE = ".agent-gspo-complete"
log = logging.getLogger(__name__)


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


WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def _check_loadable(folder: Path, what: str) -> None:
    """``folder`` holds what ``from_pretrained`` loads: config, weights (every shard an index names)
    and a tokenizer. A presence check, cheap for any model size; what it misses (a corrupt file)
    the loader reports."""
    _check_hf_folder(folder, what)
    indexes = [folder / name for name in WEIGHT_INDEXES if (folder / name).is_file()]
    for index in indexes:
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelUriError(f"{what}: {index} is not a weight index ({type(exc).__name__}: {exc})") from None
        missing = sorted(s for s in shards if not (folder / str(s)).is_file())
        if missing:
            raise ModelUriError(f"{what}: {folder} lacks weight shards its {index.name} names: "
                                f"{', '.join(missing[:5])}")
    if not indexes and not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise ModelUriError(f"{what}: {folder} has no weights ({', '.join(WEIGHT_FILES)} or a sharded index)")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelUriError(f"{what}: {folder} has no tokenizer ({', '.join(TOKENIZER_FILES)})")


def system_signature(settings: Mapping[str, Any]) -> ModelSignature:
    """Request / response / params of the served system; params default to the trained settings."""
    mas = settings["mas"]
    message = Object([Property("agent", "long"), Property("role", "string"), Property("round", "long"),
                      Property("silent", "boolean"), Property("text", "string"), Property("prompt_tokens", "long"),
                      Property("completion_tokens", "long"), Property("recipients", Array("long"))])
    # Any, not string, for question and choices: MLflow's string enforcement converts before predict sees
    # the value (a question 123, true or {"a": 1} became the text '123', 'True', "{'a': 1}" and was
    # answered; ["a", null] became ["a", "n"]); passed through, served_inputs refuses them by name.
    # Any, not Array(Any), for choices: MLflow packs an Array column of the columnar form into one
    # numpy array, so choices of different lengths or a null one were a 400 "inhomogeneous shape"
    # before predict ran, and a row of the `inputs` list without choices a 400 "got float"
    inputs = Schema([ColSpec(AnyType(), "question"), ColSpec("string", "answer_type", required=False),
                     ColSpec(AnyType(), "choices", required=False)])
    outputs = Schema([ColSpec("string", "answer", required=False), ColSpec("string", "final_text"),
                      ColSpec(Array(message), "transcript"),
                      *[ColSpec("long", key) for key in ("prompt_tokens", "completion_tokens", "communicated_tokens",
                                                         "total_tokens", "turns", "messages")]])
    params = ParamSchema([ParamSpec("agents", "long", int(mas["agents"])),
                          ParamSpec("rounds", "long", int(mas["rounds"])),
                          ParamSpec("max_new_tokens", "long", int(mas["max_message_tokens"])),
                          ParamSpec("temperature", "double", 0.0), ParamSpec("seed", "long", 0)])
    return ModelSignature(inputs=inputs, outputs=outputs, params=params)


INPUT_EXAMPLE = {"question": ["Tom has 3 apples and buys 4 more. How many apples does he have?",
                              "Which planet is known as the Red Planet?"],
                 "answer_type": ["numeric", "choice"],
                 "choices": [None, ["Venus", "Mars", "Jupiter", "Saturn"]]}
"""A request of the signature's shape (a numeric question; a multiple-choice one with its options),
saved with the model so the registry page shows it and ``mlflow models serve`` users can copy it."""


def input_example() -> Any:
    """:data:`INPUT_EXAMPLE` as the DataFrame the pyfunc receives."""
    import pandas as pd

    return pd.DataFrame(INPUT_EXAMPLE)


@contextlib.contextmanager
def _example_not_served_at_log_time() -> Iterator[None]:
    """Save the input example without MLflow serving it first: with an example, ``Model.log``
    loads the logged model and runs a prediction (``mlflow.models.utils._validate_serving_input``),
    i.e. the whole multi-agent system once more inside the training process, after training. The
    signature is given, so nothing is inferred from the example; serving is tested on its own
    (``tests/integration/test_serving.py``)."""
    import mlflow.models.utils as model_utils

    if not hasattr(model_utils, "_validate_serving_input"):  # another MLflow: keep its behaviour
        yield
        return
    real = model_utils._validate_serving_input
    model_utils._validate_serving_input = lambda *args, **kwargs: None
    try:
        yield
    finally:
        model_utils._validate_serving_input = real


def _stage_code(tmp: Path) -> Path:
    """A clean copy of the ``components`` package (no caches) to ship as the model's code."""
    target = tmp / "code" / "components"
    shutil.copytree(PACKAGE_DIR, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return target


def log_policy_model(model_dir: Path, *, registered_name: str, tags: Mapping[str, Any],
                     settings: Mapping[str, Any], tracking_uri: str | None = None,
                     artifact_name: str = "policy") -> ModelVersion:
    """Log ``model_dir`` (HF model + tokenizer) with its training ``settings`` and register a new version.

    ``settings`` come from :func:`components.tracking.served.system_settings`. ``tags`` go on the
    model version (data manifest hash, config hash, ...); ``git.commit`` is added from
    :func:`git_commit` when absent. Logs into the active run if there is one. Returns the new
    ``ModelVersion`` (status READY).
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
    signature = system_signature(settings)
    metadata_ = {"agent_gspo": {"mas": dict(settings["mas"]), "config_sha256": settings.get("config_sha256")}}

    def _log() -> ModelVersion:
        with tempfile.TemporaryDirectory(prefix="agent-gspo-model-") as tmp:
            settings_path = Path(tmp) / SETTINGS_FILE
            settings_path.write_text(json.dumps(dict(settings), indent=2, sort_keys=True))
            with _example_not_served_at_log_time():
                info = mlflow.pyfunc.log_model(
                    name=artifact_name, python_model=str(PYFUNC_CODE),
                    artifacts={ARTIFACT_KEY: str(model_dir), SETTINGS_KEY: str(settings_path)},
                    code_paths=[str(_stage_code(Path(tmp)))], pip_requirements=_pinned_requirements(),
                    signature=signature, input_example=input_example(), metadata=metadata_)
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

    * an existing local folder -> ``Path`` (must hold a config, weights and a tokenizer);
    * ``models:/<name>@<alias>`` or ``models:/<name>/<version>`` -> the alias is resolved to a
      version first, its artifacts are downloaded once into
      ``<dst_dir or $AGENT_GSPO_MODEL_CACHE or ~/.cache/agent-gspo/registry>/<name>/<version>-<key>``
      (key: hash of the registry URI and the version's source run)
      (atomically, marked complete only once it holds a loadable model; a cached copy that no
      longer does is downloaded again) and the HF folder inside is returned as ``Path``;
    * anything shaped like a hub id (``org/name``) -> returned unchanged as ``str``.
    Raises :class:`ModelUriError` for a missing folder / model / alias, :class:`TrackingError`
    when the registry is unreachable.
    """
    text = os.fspath(uri)
    local = Path(text).expanduser()
    if local.exists():
        _check_loadable(local, f"model {text!r}")
        return local
    if text.startswith("models:/"):
        return _download_registered(text, dst_dir, tracking_uri)
    if HF_ID_RE.match(text) and not text.startswith((".", "~")):
        return text
    raise ModelUriError(f"model {text!r}: no such folder, and not a models:/<name>@<alias>, "
                        f"models:/<name>/<version> URI or a hub id")


def _download_registered(text: str, dst_dir: str | os.PathLike[str] | None, tracking_uri: str | None) -> Path:
    name, _, _ = parse_models_uri(text)
    uri = tracking_uri or mlflow.get_tracking_uri()
    configure_http_retries()
    check_reachable(uri)
    client = guarded(uri, "open the registry", lambda: MlflowClient(tracking_uri=uri, registry_uri=uri))
    mv = get_model_version(client, text, uri=uri)
    cache = Path(dst_dir or os.environ.get("AGENT_GSPO_MODEL_CACHE", DEFAULT_CACHE)).expanduser()
    # "<name>/<version>" alone is not an identity: every registry has its own version 1. Key the
    # download by the registry and the version's source run too, so another registry's (or a
    # re-created database's) version 1 is never served from this cache.
    ident = hashlib.sha256(f"{uri}|{mv.run_id}|{mv.source}".encode()).hexdigest()[:16]
    target = cache / re.sub(r"[^\w.\-]", "_", name) / f"{mv.version}-{ident}"
    where = (f"model {text!r} (download cache {target}: a cache, safe to delete; $AGENT_GSPO_MODEL_CACHE "
             "moves it)")
    if (target / _COMPLETE).exists():
        try:
            return _loadable_in(target, where)
        except ModelUriError as exc:  # a file went missing from the cache since: never reuse it
            log.warning("warning: %s; downloading it again", exc)
    with atomic_dir(target) as staging:
        download_version_artifacts(client, name, str(mv.version), staging, uri=uri)
        try:  # checked before it is marked complete: a broken download is not cached
            _loadable_in(staging, where)
        except ModelUriError as exc:  # named as the cache folder it would have become
            detail = str(exc).replace(str(staging), str(target))
            raise ModelUriError(f"{detail}: the registry's artifacts of {name} v{mv.version} ({mv.source}) are "
                                "incomplete; nothing was cached, repair or re-register the version") from None
        (staging / _COMPLETE).write_text(f"{name}/{mv.version}\n")
    return _loadable_in(target, where)


def _loadable_in(root: Path, where: str) -> Path:
    """The HF folder inside the downloaded model ``root``, checked loadable (``where`` names it in errors)."""
    try:
        folder = _hf_folder_in(root)
    except (ModelUriError, OSError, yaml.YAMLError) as exc:
        raise ModelUriError(f"{where}: {exc}") from None
    _check_loadable(folder, where)
    return folder
