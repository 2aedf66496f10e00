"""The MLflow datasets built for a run's inputs: name, digest (the manifest's content hash), source."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from components.tracking.lineage import log_evaluation_inputs, prepared_datasets


def test_datasets_carry_the_manifest_hash_or_the_files_own(tmp_path: Path) -> None:
    for bench in ("gsm8k", "aqua"):
        (tmp_path / bench).mkdir()
        (tmp_path / bench / "test.parquet").write_bytes(bench.encode())
    listed = "a" * 64
    (tmp_path / "manifest.json").write_text(json.dumps({"benchmarks": {"gsm8k": {
        "output_sha256": {"gsm8k/test.parquet": listed}, "rows": {"test": 7}}}}))
    gsm, aqua = prepared_datasets(tmp_path, [("gsm8k", "test"), ("aqua", "test"), ("gsm8k", "test"),
                                             ("svamp", "test")])  # a repeat, and a split never prepared
    assert (gsm.name, gsm.digest, gsm.source_type) == ("gsm8k/test", listed[:36], "local")
    assert json.loads(gsm.source) == {"uri": str((tmp_path / "gsm8k" / "test.parquet").resolve())}
    assert json.loads(gsm.profile) == {"sha256": listed, "num_rows": 7}
    own = hashlib.sha256(b"aqua").hexdigest()  # not in the manifest: hashed from the file
    assert (aqua.name, aqua.digest, json.loads(aqua.profile)["sha256"]) == ("aqua/test", own[:36], own)


def test_a_dev_set_evaluation_logs_each_benchmarks_source_split(tmp_path: Path) -> None:
    for bench, split in (("gsm8k", "train"), ("humaneval", "test")):
        (tmp_path / bench).mkdir()
        (tmp_path / bench / f"{split}.parquet").write_bytes(bench.encode())
    (tmp_path / "manifest.json").write_text(json.dumps({"benchmarks": {}}))
    seen: list = []

    class Run:
        def log_inputs(self, *, datasets=(), context="", model_ids=()) -> None:
            seen.extend(d.name for d in datasets)

    meta = {"data_dir": str(tmp_path), "split": "devset", "item_ids": {"gsm8k": ["a"], "humaneval": ["b"]},
            "devset": {"test_limit": 100, "benchmarks": {"gsm8k": {"split": "train"}, "humaneval": {"split": "test"}}}}
    log_evaluation_inputs(Run(), meta, None)
    assert seen == ["gsm8k/train", "humaneval/test"]
