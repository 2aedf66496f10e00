"""``registered_model.json`` in a trained policy folder: no password in it, and the folder is still
recognised when the password moves from the URI to ``$MLFLOW_TRACKING_PASSWORD``."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from components.tracking import versions
from components.tracking.versions import REGISTERED_FILE, VersionRef, registration_of, registry_identity


def test_the_registration_file_holds_no_password(tmp_path: Path) -> None:
    path = versions.write_registration(tmp_path, VersionRef("agent-gspo-policy", "1"),
                                       uri="http://alice:S3cretPW@127.0.0.1:34025", run_id="r1")
    text = path.read_text()
    assert "S3cretPW" not in text
    assert json.loads(text)["tracking_uri"] == "http://alice:***@127.0.0.1:34025"


@pytest.mark.parametrize("written", ["http://alice:S3cretPW@127.0.0.1:34025",  # by the old code, in clear
                                     "http://alice:***@127.0.0.1:34025"])
@pytest.mark.parametrize("now", ["http://alice@127.0.0.1:34025", "http://127.0.0.1:34025",
                                 "http://alice:S3cretPW@127.0.0.1:34025"])
def test_a_folder_is_recognised_whichever_way_the_credentials_are_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, written: str, now: str) -> None:
    (tmp_path / REGISTERED_FILE).write_text(json.dumps({"name": "p", "version": "3", "tracking_uri": written,
                                                        "run_id": "r1"}))
    asked: list[str] = []
    monkeypatch.setattr(versions, "registry_client", lambda uri: asked.append(uri) or object())
    monkeypatch.setattr(versions, "get_model_version",
                        lambda client, text, uri: SimpleNamespace(name="p", version=3, run_id="r1"))
    assert registration_of(tmp_path, uri=now) == VersionRef("p", "3")
    assert asked == [now]  # the registry is opened with the URI given now (and its credentials)


def test_another_registry_is_not_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    versions.write_registration(tmp_path, VersionRef("p", "3"), uri="http://alice:pw@127.0.0.1:34025", run_id="r1")
    monkeypatch.setattr(versions, "registry_client", lambda uri: pytest.fail("another registry was opened"))
    assert registration_of(tmp_path, uri="http://alice:pw@127.0.0.1:5000") is None
    assert registry_identity("http://u:p@h:1/x?token=abc") == "http://h:1/x?token=***"
    assert registry_identity("sqlite:///mlflow.db") == "sqlite:///mlflow.db"


def test_a_folder_whose_weights_changed_is_not_the_registered_version(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy of a registered folder with other weights (noise added, or swapped) must not record its
    results on the registered version; the same weights, or a folder from before the digest, still do."""
    (tmp_path / "model.safetensors").write_bytes(b"weights-1")
    (tmp_path / "config.json").write_text("{}")
    versions.write_registration(tmp_path, VersionRef("p", "3"), uri="sqlite:///m.db", run_id="r1")
    monkeypatch.setattr(versions, "registry_client", lambda uri: object())
    monkeypatch.setattr(versions, "get_model_version",
                        lambda client, text, uri: SimpleNamespace(name="p", version=3, run_id="r1"))
    assert registration_of(tmp_path, uri="sqlite:///m.db") == VersionRef("p", "3")
    (tmp_path / "config.json").write_text('{"edited": 1}')  # not a weight file: still the version
    assert registration_of(tmp_path, uri="sqlite:///m.db") == VersionRef("p", "3")
    # another size: file_sha256 is memoised per (path, size, mtime) within a process, and two writes in
    # one test may share an mtime; a new process (the evaluate that reads the folder) hashes afresh
    (tmp_path / "model.safetensors").write_bytes(b"weights-two")
    assert registration_of(tmp_path, uri="sqlite:///m.db") is None
    (tmp_path / "model.safetensors").write_bytes(b"weights-1")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "adapter.bin").write_bytes(b"extra")  # a weight file added
    assert registration_of(tmp_path, uri="sqlite:///m.db") is None
    rec = json.loads((tmp_path / REGISTERED_FILE).read_text())
    del rec["weights_sha256"]  # written before the digest existed
    (tmp_path / REGISTERED_FILE).write_text(json.dumps(rec))
    assert registration_of(tmp_path, uri="sqlite:///m.db") == VersionRef("p", "3")
