"""Data and scoring edges: duplicated records fail validation, killed prepares leave nothing a
later prepare trips on, concurrent prepares into one folder lose nothing, and ``score`` never
passes the accuracy of a subset off as the benchmark's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT

from components.config import DataConfig
from components.data.expectations import validate, validate_frame
from components.data.item import as_items
from components.data.prepare import load_manifest, prepare, records_to_table
from components.data.sources import load_benchmark
from components.io import file_lock
from components.scoring import score_predictions_file

OFFLINE = DataConfig(use_hub=False)
"""the mirror only: prepare never asks the hub"""

ROOT = REPO_ROOT
MIRROR = Path(os.environ.get("AGENT_GSPO_DATA_MIRROR", ROOT.parent / "shared" / "benchmarks"))
needs_mirror = pytest.mark.skipif(not (MIRROR / "gsm8k").is_dir(), reason=f"benchmark mirror not at {MIRROR}")


def _frame(name: str, split: str):
    return records_to_table(load_benchmark(name, mirror=MIRROR, use_hub=False).splits[split]).to_pandas()


@needs_mirror
@pytest.mark.parametrize("name, split", [("aqua", "dev"), ("gsm8k", "test"), ("mmlu", "dev"), ("multiarith", "test")])
def test_a_duplicated_record_fails_validation(name: str, split: str) -> None:
    df = _frame(name, split)
    assert validate_frame(name, split, df).success  # the upstream data as it is (its own repeats allowed)
    dup = df.copy()
    dup.iloc[7] = df.iloc[3]  # a record twice (the row count stays right)
    dup.loc[7, "id"] = df.loc[7, "id"]  # even under a fresh, unique id
    res = validate_frame(name, split, dup)
    assert not res.success
    (failure,) = res.failures
    assert failure["column"] == "repeats_earlier_record" and df.loc[7, "id"] in failure["example_rows"]
    assert "repeating an earlier record" in failure["observed"]


def _prepare_in_child(out: Path, names: list[str], fault: str = "") -> subprocess.CompletedProcess:
    """``prepare(names)`` in a child process; ``fault`` is code run first (e.g. a SIGKILL trap)."""
    code = (f"import os, signal, sys\n{fault}\nfrom components.config import DataConfig\n"
            "from components.data.prepare import prepare\n"
            f"prepare({names!r}, mirror={str(MIRROR)!r}, out_dir={str(out)!r}, data=DataConfig(use_hub=False), "
            "progress=False)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)


KILL_BETWEEN_RENAMES = """
import components.io as io
_replace = os.replace
def _trap(src, dst):
    _replace(src, dst)
    if ".old-" in str(dst):  # the old folder is moved away, the new one not yet in place
        os.kill(os.getpid(), signal.SIGKILL)
io.os.replace = _trap
"""
KILL_WHILE_STAGING = """
import pyarrow.parquet as pq
_write = pq.write_table
def _trap(table, where, *a, **k):
    _write(table, where, *a, **k)
    os.kill(os.getpid(), signal.SIGKILL)
pq.write_table = _trap
"""


def _leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith(".") and not p.name.endswith(".lock"))


@needs_mirror
def test_killed_prepares_leave_nothing_behind(tmp_path: Path) -> None:
    out = tmp_path / "data"
    prepare(["aqua", "svamp"], mirror=MIRROR, out_dir=out, data=OFFLINE, progress=False)
    before = (out / "aqua" / "test.parquet").read_bytes()

    killed = _prepare_in_child(out, ["aqua"], KILL_BETWEEN_RENAMES)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not (out / "aqua").exists() and any(".aqua.old-" in n for n in _leftovers(out))
    killed = _prepare_in_child(out, ["svamp"], KILL_WHILE_STAGING)
    assert killed.returncode == -9 and any(n.endswith(".staging") for n in _leftovers(out))

    # a later prepare of *another* benchmark finishes the cut swap and clears the staging folder
    prepare(["gsm8k"], mirror=MIRROR, out_dir=out, data=OFFLINE, progress=False)
    assert _leftovers(out) == []
    assert (out / "aqua" / "test.parquet").read_bytes() == before
    assert set(load_manifest(out)["benchmarks"]) == {"aqua", "gsm8k", "svamp"}
    validate(out, tmp_path / "report.md", ["aqua", "gsm8k", "svamp"])


@needs_mirror
@pytest.mark.slow
def test_concurrent_prepares_lose_no_manifest_entry(tmp_path: Path) -> None:
    out = tmp_path / "data"
    names = ["aqua", "svamp", "multiarith", "math500"]
    procs = [subprocess.Popen([sys.executable, "-c", (
        "from components.config import DataConfig\nfrom components.data.prepare import prepare\n"
        f"prepare([{n!r}], mirror={str(MIRROR)!r}, out_dir={str(out)!r}, data=DataConfig(use_hub=False), "
        "progress=False)\n")],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True) for n in names]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
    assert set(load_manifest(out)["benchmarks"]) == set(names)
    assert _leftovers(out) == []


@needs_mirror
def test_the_manifest_lock_is_honoured(tmp_path: Path) -> None:
    out = tmp_path / "data"
    done = threading.Event()
    with file_lock(out / ".manifest.lock"):
        worker = threading.Thread(target=lambda: (prepare(["aqua"], mirror=MIRROR, out_dir=out, data=OFFLINE,
                                                          progress=False), done.set()))
        worker.start()
        time.sleep(3.0)
        assert not done.is_set() and not (out / "manifest.json").exists()  # waiting for the lock
    worker.join(120)
    assert done.is_set() and "aqua" in load_manifest(out)["benchmarks"]


RECORDS = [{"id": f"gsm8k/test/{i}", "benchmark": "gsm8k", "split": "test", "question": "q", "choices": None,
            "answer": str(i), "answer_type": "numeric", "meta": {}} for i in range(10)]


def test_score_counts_missing_predictions_as_wrong(tmp_path: Path) -> None:
    preds = tmp_path / "p.jsonl"
    preds.write_text("".join(json.dumps({"id": f"gsm8k/test/{i}", "prediction": f"#### {i}"}) + "\n"
                             for i in range(2)))  # only the two answers one is sure of
    summary = score_predictions_file(as_items(RECORDS), preds, None)
    assert summary["accuracy"] == 0.2 and summary["coverage"] == 0.2
    assert summary["accuracy_on_submitted"] == 1.0 and summary["n"] == 2 and summary["n_records"] == 10
    assert len(summary["missing_ids"]) == 8
    out = tmp_path / "o.jsonl"
    score_predictions_file(as_items(RECORDS), preds, out)
    assert [set(json.loads(line)) for line in out.read_text().splitlines()] == [
        {"id", "correct", "extracted", "error"}] * 2  # the per-line format is unchanged
