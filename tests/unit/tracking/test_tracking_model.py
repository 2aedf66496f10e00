"""Policy model logging, registration, provenance tags and models:/ resolution (sqlite:///)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers.paths import load_test_module
from mlflow import MlflowClient

from components.tracking import ModelUriError, Tracker, log_policy_model, resolve_model_uri

test_tracking_helpers = load_test_module("test_tracking_helpers")

mlflow_uri = test_tracking_helpers.mlflow_uri  # shared pytest fixture


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = test_tracking_helpers.build_tiny_hf_model(tmp_path_factory.mktemp("tiny") / "policy")
    size = sum(p.stat().st_size for p in folder.iterdir())
    assert size < 1_000_000, size
    return folder


def test_log_register_tag_and_resolve_round_trip(mlflow_uri: str, tiny_model: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("AGENT_GSPO_GIT_COMMIT", "c0ffee")
    tags = {"data.manifest_sha256": "d" * 64, "config.sha256": "c" * 64}
    start = time.perf_counter()
    with Tracker(mlflow_uri, "exp", "train") as tracker:
        mv = tracker.log_policy_model(tiny_model, registered_name="policy", tags=tags,
                                      settings=test_tracking_helpers.system_settings())
        run_id = tracker.run_id
    log_s = time.perf_counter() - start
    client = MlflowClient(mlflow_uri)
    stored = client.get_model_version("policy", mv.version)
    assert stored.status == "READY" and str(mv.version) == "1"
    assert stored.tags == {**tags, "git.commit": "c0ffee"}
    assert stored.run_id == run_id
    client.set_registered_model_alias("policy", "champion", mv.version)

    start = time.perf_counter()
    folder = resolve_model_uri("models:/policy@champion", dst_dir=tmp_path / "cache", tracking_uri=mlflow_uri)
    resolve_s = time.perf_counter() - start
    assert isinstance(folder, Path) and (folder / "config.json").exists()
    print(f"log+register {log_s:.2f}s, resolve {resolve_s:.2f}s")
    assert resolve_model_uri("models:/policy/1", dst_dir=tmp_path / "cache", tracking_uri=mlflow_uri) == folder

    original = AutoModelForCausalLM.from_pretrained(tiny_model)
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok("the answer is 42", return_tensors="pt")["input_ids"]  # (1, seq)
    assert ids.shape[1] > 1
    with torch.no_grad():
        assert torch.equal(original(ids).logits, loaded(ids).logits)


def test_second_version_and_alias_move_resolve_to_new_folder(mlflow_uri: str, tiny_model: Path,
                                                             tmp_path: Path) -> None:
    settings = test_tracking_helpers.system_settings()
    v1 = log_policy_model(tiny_model, registered_name="p2", tags={"k": "1"}, settings=settings,
                          tracking_uri=mlflow_uri)
    v2 = log_policy_model(tiny_model, registered_name="p2", tags={"k": "2"}, settings=settings,
                          tracking_uri=mlflow_uri)
    assert (str(v1.version), str(v2.version)) == ("1", "2")
    client = MlflowClient(mlflow_uri)
    client.set_registered_model_alias("p2", "champion", "1")
    first = resolve_model_uri("models:/p2@champion", dst_dir=tmp_path, tracking_uri=mlflow_uri)
    client.set_registered_model_alias("p2", "champion", "2")
    second = resolve_model_uri("models:/p2@champion", dst_dir=tmp_path, tracking_uri=mlflow_uri)
    assert first != second and "/p2/1-" in str(first) and "/p2/2-" in str(second)
    assert resolve_model_uri("models:/p2", dst_dir=tmp_path, tracking_uri=mlflow_uri) == second  # newest


def test_resolve_local_folder_hub_id_and_errors(mlflow_uri: str, tiny_model: Path, tmp_path: Path) -> None:
    assert resolve_model_uri(tiny_model) == tiny_model
    assert resolve_model_uri(str(tiny_model)) == tiny_model
    assert resolve_model_uri("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    with pytest.raises(ModelUriError, match="no config.json"):
        resolve_model_uri(tmp_path)
    with pytest.raises(ModelUriError, match="no such folder"):
        resolve_model_uri("./missing/folder")
    with pytest.raises(ModelUriError, match="stages are not used"):
        resolve_model_uri("models:/policy/Production", tracking_uri=mlflow_uri)
    with pytest.raises(ModelUriError, match="no registered model 'nope'"):
        resolve_model_uri("models:/nope@champion", dst_dir=tmp_path, tracking_uri=mlflow_uri)
    with pytest.raises(ModelUriError, match="no config.json"):
        log_policy_model(tmp_path, registered_name="x", tags={}, settings=test_tracking_helpers.system_settings(),
                         tracking_uri=mlflow_uri)


def test_same_name_and_version_in_two_registries_never_share_a_download(tiny_model: Path, tmp_path: Path) -> None:
    """Every registry has its own version 1: the download cache must not serve one for the other."""
    import shutil

    other_model = tmp_path / "other"
    shutil.copytree(tiny_model, other_model)
    (other_model / "marker.txt").write_text("the other registry's policy")
    cache = tmp_path / "cache"
    folders = []
    for db, model in (("a.db", tiny_model), ("b.db", other_model)):
        uri = f"sqlite:///{tmp_path / db}"
        log_policy_model(model, registered_name="same", tags={}, settings=test_tracking_helpers.system_settings(),
                         tracking_uri=uri)
        folders.append(resolve_model_uri("models:/same/1", dst_dir=cache, tracking_uri=uri))
    assert folders[0] != folders[1]
    assert not (folders[0] / "marker.txt").exists() and (folders[1] / "marker.txt").exists()


def test_the_registered_model_carries_an_input_example_without_being_served_at_log_time(
        mlflow_uri: str, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry page shows a request example consistent with the signature; logging it does not
    load and run the multi-agent system (MLflow would, to validate the example)."""
    import mlflow
    from mlflow.models.utils import _enforce_schema

    loaded: list[int] = []

    def never(*args, **kwargs):
        loaded.append(1)  # MLflow catches what its validation raises: counted, not raised
        raise AssertionError("the model was loaded at log time")

    monkeypatch.setattr("components.tracking.served.ServedSystem.load", never)
    with Tracker(mlflow_uri, "exp", "train") as tracker:
        mv = tracker.log_policy_model(tiny_model, registered_name="policy", tags={},
                                      settings=test_tracking_helpers.system_settings())
    assert loaded == []
    info = mlflow.models.get_model_info(f"models:/policy/{mv.version}")
    assert info.saved_input_example_info is not None
    example = mlflow.models.Model.load(f"models:/policy/{mv.version}").load_input_example()
    assert "question" in example.columns and len(example) >= 1
    _enforce_schema(example, info.signature.inputs)  # raises when the example does not fit the signature
