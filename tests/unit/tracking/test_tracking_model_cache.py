"""The ``models:/`` download cache keeps only loadable copies: a broken download is not cached, so a
repaired registry is read again, and a cached copy that lost a file is downloaded again."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers.paths import load_test_module

from components.tracking import ModelUriError, log_policy_model, resolve_model_uri
from components.tracking.policy_model import _COMPLETE  # noqa: PLC2701

test_tracking_helpers = load_test_module("test_tracking_helpers")

mlflow_uri = test_tracking_helpers.mlflow_uri  # shared pytest fixture


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return test_tracking_helpers.build_tiny_hf_model(tmp_path_factory.mktemp("tiny") / "policy")


def register_in_tmp(uri: str, model: Path, artifacts: Path, name: str = "p", **settings_overrides: str) -> str:
    """Register ``model`` as a new version of ``name`` with its artifacts under ``artifacts`` (not in
    the template database's default experiment folder); return the version."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    exp = mlflow.get_experiment_by_name("cache-tests")
    exp_id = exp.experiment_id if exp else mlflow.create_experiment("cache-tests", artifact_location=str(artifacts))
    with mlflow.start_run(experiment_id=exp_id):
        mv = log_policy_model(model, registered_name=name, tags={}, tracking_uri=uri,
                              settings=test_tracking_helpers.system_settings(*settings_overrides.values()))
    return str(mv.version)


def _registered(uri: str, model: Path, artifacts: Path) -> Path:
    """Register ``model``; return the weights file in the registry's artifact store."""
    register_in_tmp(uri, model, artifacts)
    stored = list(artifacts.rglob("model.safetensors"))
    assert len(stored) == 1, stored
    return stored[0]


def test_a_broken_download_is_not_cached_and_the_repaired_registry_is_read(
        mlflow_uri: str, tiny_model: Path, tmp_path: Path) -> None:
    weights = _registered(mlflow_uri, tiny_model, tmp_path / "artifacts")
    kept = tmp_path / "kept.safetensors"
    shutil.move(weights, kept)  # the registry lost the weights file
    cache = tmp_path / "cache"
    with pytest.raises(ModelUriError) as err:
        resolve_model_uri("models:/p/1", dst_dir=cache, tracking_uri=mlflow_uri)
    text = str(err.value)
    assert "models:/p/1" in text and "has no weights" in text and "download cache" in text
    assert str(cache / "p") in text and "safe to delete" in text and "AGENT_GSPO_MODEL_CACHE" in text
    assert "staging" not in text
    assert not list(cache.rglob(_COMPLETE))  # nothing marked complete

    shutil.move(kept, weights)  # the registry is repaired
    folder = resolve_model_uri("models:/p/1", dst_dir=cache, tracking_uri=mlflow_uri)
    assert (folder / "model.safetensors").is_file()


def test_a_cached_copy_that_lost_a_file_is_downloaded_again(mlflow_uri: str, tiny_model: Path, tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    _registered(mlflow_uri, tiny_model, tmp_path / "artifacts")
    cache = tmp_path / "cache"
    folder = resolve_model_uri("models:/p/1", dst_dir=cache, tracking_uri=mlflow_uri)
    (folder / "tokenizer.json").unlink()  # e.g. a disk clean-up, or a copy from the old code
    with caplog.at_level("WARNING"):
        again = resolve_model_uri("models:/p/1", dst_dir=cache, tracking_uri=mlflow_uri)
    assert again == folder and (again / "tokenizer.json").is_file()
    assert "has no tokenizer" in caplog.text and "downloading it again" in caplog.text


def test_a_local_folder_without_weights_is_refused_by_name(tiny_model: Path, tmp_path: Path) -> None:
    folder = shutil.copytree(tiny_model, tmp_path / "policy")
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelUriError, match="has no weights"):
        resolve_model_uri(folder)
    (folder / "model.safetensors.index.json").write_text('{"weight_map": {"a": "model-00001-of-00002.safetensors"}}')
    with pytest.raises(ModelUriError, match="lacks weight shards .*model-00001-of-00002.safetensors"):
        resolve_model_uri(folder)
