"""What ``prepare`` refuses before it writes, and what a refused write leaves: an output folder that
is (in) the mirror, a full disk while staging (every benchmark and the manifest stay as they were,
the Prefect flow's stage/commit path too), a corrupt prepared file, a mirror file whose sha256
differs from the mirror's MANIFEST.json, a broken manifest.json, special mirror files, a BOM in
an MMLU CSV and a repeated benchmark name: each one line, exit 2."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT, load_test_module
from helpers.prepared import record_in_manifest

import components.data.outputs as outputs
from components.cli import main
from components.config import DataConfig, load_config
from components.data.outputs import StagedBenchmark
from components.data.prepare import load_split, prepare
from components.data.sources import load_benchmark
from components.data.spec import DataError, DataWriteError
from components.errors import UserError
from components.io import staging_dir, swap_in
from components.jobs import PrepareJob

humaneval_rows = load_test_module("test_data_robustness").humaneval_rows
multiarith_items = load_test_module("test_data_robustness").multiarith_items
snapshot = load_test_module("test_data_robustness").snapshot
write_mirror = load_test_module("test_data_robustness").write_mirror

OFFLINE = DataConfig(use_hub=False)
"""the mirror only: prepare never asks the hub"""

ROOT = REPO_ROOT
MIRROR = Path(os.environ.get("AGENT_GSPO_DATA_MIRROR", ROOT.parent / "shared" / "benchmarks"))


def visible(snap: dict[str, bytes | None]) -> dict[str, bytes | None]:
    return {k: v for k, v in snap.items() if not k.startswith(".")}


def run_cli(*args: str, mirror: Path, out: Path, report_dir: Path, benchmarks: str = "multiarith") -> int:
    return main(["prepare", "--mirror", str(mirror), "--benchmarks", benchmarks, "--out", str(out),
                 "--no-validate", "--set", "data.use_hub=false", "--set", f"data.report_dir={report_dir}", *args])


@pytest.fixture
def prepared(tmp_path: Path) -> Path:
    """A valid prepared folder (multiarith + humaneval) from a synthetic mirror."""
    good = write_mirror(tmp_path / "good", multiarith_items(), humaneval_rows())
    prepare(["multiarith", "humaneval"], mirror=good, out_dir=tmp_path / "out", data=OFFLINE, progress=False)
    return tmp_path / "out"


@pytest.fixture
def changed(tmp_path: Path) -> Path:
    """A valid mirror whose two benchmarks both differ from ``prepared``'s."""
    return write_mirror(tmp_path / "changed", [{**r, "sQuestion": r["sQuestion"] + "!"} for r in multiarith_items()],
                        humaneval_rows(variant=" (changed)"))


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


# ------------------------------------------------------------------------------ D5: out vs mirror


@pytest.mark.parametrize("where", ["mirror", "inside", "contains", "symlink"])
def test_an_output_folder_that_is_in_or_holds_the_mirror_is_refused(tmp_path: Path, capsys, where: str) -> None:
    mirror = write_mirror(tmp_path / "parent" / "mirror", multiarith_items())
    (tmp_path / "link").symlink_to(mirror)
    out = {"mirror": mirror, "inside": mirror / "prepared", "contains": tmp_path / "parent",
           "symlink": tmp_path / "link"}[where]
    before = snapshot(tmp_path / "parent")
    assert run_cli(mirror=mirror, out=out, report_dir=tmp_path / "r") == 2
    err = _one_line_error(capsys)
    assert str(out) in err and str(mirror) in err and "mirror" in err.split(str(out), 1)[1]
    assert snapshot(tmp_path / "parent") == before and (mirror / "multiarith/MultiArith.json").is_file()


# ------------------------------------------------------------------- D6: all or nothing on disk errors


def _fail_on_call(monkeypatch: pytest.MonkeyPatch, n: int, code: int) -> None:
    """``pq.write_table`` as the write phase calls it refuses its ``n``-th call with ``code``."""
    real, calls = outputs.pq.write_table, [0]

    def write_table(table, where, *args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            raise OSError(code, os.strerror(code))
        return real(table, where, *args, **kwargs)

    monkeypatch.setattr(outputs.pq, "write_table", write_table)


def _leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith(".") and not p.name.endswith(".lock"))


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_refused_write_while_staging_replaces_no_benchmark(prepared: Path, changed: Path, tmp_path: Path,
                                                             monkeypatch, capsys, code: int) -> None:
    before = snapshot(prepared)
    _fail_on_call(monkeypatch, 2, code)  # multiarith/test.parquet staged, then humaneval/test.parquet refused
    assert run_cli(mirror=changed, out=prepared, report_dir=tmp_path / "r", benchmarks="multiarith,humaneval") == 2
    err = _one_line_error(capsys)
    assert f"cannot write {prepared / 'humaneval' / 'test.parquet'}: {os.strerror(code)}; nothing in" in err
    assert snapshot(prepared) == before and _leftovers(prepared) == []  # multiarith and the manifest too

    monkeypatch.undo()
    prepare(["multiarith", "humaneval"], mirror=changed, out_dir=prepared, data=OFFLINE, progress=False)
    assert snapshot(prepared) != before  # the same prepare goes through once the disk takes it


def test_a_refused_manifest_write_replaces_no_benchmark(prepared: Path, changed: Path, monkeypatch) -> None:
    before = snapshot(prepared)
    real = Path.write_text

    def write_text(self: Path, *args, **kwargs):
        if self.name.startswith(".manifest.json."):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    with pytest.raises(DataWriteError, match=re.escape(f"cannot write {prepared / 'manifest.json'}: No space left")):
        prepare(["multiarith", "humaneval"], mirror=changed, out_dir=prepared, data=OFFLINE, progress=False)
    assert snapshot(prepared) == before and _leftovers(prepared) == []


def test_swap_in_puts_every_folder_back_when_one_rename_fails(tmp_path: Path, monkeypatch) -> None:
    targets = [tmp_path / "a", tmp_path / "b"]
    for t in targets:
        t.mkdir()
        (t / "f").write_text("old")
    stagings = [staging_dir(t) for t in targets]
    for s in stagings:
        (s / "f").write_text("new")
    real = os.replace

    def replace(src, dst):
        if Path(src) == stagings[1]:
            raise OSError(errno.EIO, "I/O error", str(src))
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="I/O error"):
        swap_in(list(zip(stagings, targets, strict=True)))
    monkeypatch.undo()
    assert [(t / "f").read_text() for t in targets] == ["old", "old"]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".staging")) == ["a", "b"]
    assert all((s / "f").read_text() == "new" for s in stagings)  # the caller's to remove


def _job(mirror: Path, out: Path, tmp_path: Path) -> PrepareJob:
    cfg = load_config(ROOT / "params.yaml", overrides=["data.use_hub=false", f"data.report_dir={tmp_path / 'r'}"])
    return PrepareJob(cfg=cfg, benchmarks=["multiarith", "humaneval"], mirror=str(mirror), out_dir=str(out))


def test_the_flows_stage_and_commit_are_all_or_nothing(prepared: Path, changed: Path, tmp_path: Path,
                                                       monkeypatch) -> None:
    """The Prefect data flow's write path (tasks stage under the flow's locks, one task commits)."""
    job, before = _job(changed, prepared, tmp_path), snapshot(prepared)
    job.preflight()
    _fail_on_call(monkeypatch, 2, errno.ENOSPC)
    with pytest.raises(DataWriteError, match="humaneval/test.parquet: No space left"), job.write_locks():
        staged = [job.stage_one(n) for n in job.names]
    assert snapshot(prepared) == before and _leftovers(prepared) == []  # the staged multiarith is gone too

    monkeypatch.undo()
    with job.write_locks():
        staged = [job.stage_one(n) for n in job.names]
        assert visible(snapshot(prepared)) == visible(before) and len(_leftovers(prepared)) == 2  # staged only
        manifest = job.commit(staged)
    assert set(manifest["benchmarks"]) == {"multiarith", "humaneval"} and _leftovers(prepared) == []
    after = snapshot(prepared)
    assert after != before
    with job.write_locks():  # a cached task result: its staging folder was swapped in by an earlier run
        assert job.commit(staged) == manifest
    (prepared / "multiarith/test.parquet").write_bytes(b"edited")
    with pytest.raises(DataError, match="staged files .* are gone"), job.write_locks():
        job.commit([StagedBenchmark(staged[0].result, staged[0].staging)])


# ------------------------------------------------------------------------ D8: corrupt prepared file


@pytest.mark.parametrize("damage", ["random", "truncated", "random, hash recorded"])
def test_a_corrupt_prepared_file_is_one_line_naming_it(prepared: Path, tmp_path: Path, capsys, damage: str) -> None:
    """A damaged file differs from the sha256 the manifest records; one that matches (its hash
    recorded too) but is not parquet is refused as unreadable: one line either way."""
    path = prepared / "multiarith/test.parquet"
    path.write_bytes(os.urandom(4000) if damage.startswith("random") else path.read_bytes()[:-100])
    fix = "re-run `agent-gspo prepare --benchmarks multiarith`"
    why = r"content sha256 [0-9a-f]{12}\.\.\. differs from the [0-9a-f]{12}\.\.\. that .*manifest.json records: .*"
    if damage.endswith("recorded"):
        record_in_manifest(prepared, "multiarith", "test")
        why = r"corrupt or unreadable prepared file \(.*\)"
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: {why}; {re.escape(fix)}$"):
        load_split(prepared, "multiarith", "test")
    assert main(["validate", "--data", str(prepared), "--set", f"data.report_dir={tmp_path / 'r'}",
                 "--set", "data.benchmarks=[multiarith]"]) == 2
    err = _one_line_error(capsys)
    assert str(path) in err and fix in err


# ------------------------------------------------------------------- D12: the mirror's MANIFEST.json


def _publish(mirror: Path, files: dict[str, str]) -> None:
    (mirror / "MANIFEST.json").write_text(json.dumps(
        {"files": [{"path": rel, "sha256": sha, "bytes": 1} for rel, sha in files.items()]}))


def test_a_mirror_file_that_differs_from_its_manifest_is_refused(prepared: Path, tmp_path: Path, capsys) -> None:
    mirror = write_mirror(tmp_path / "pub", multiarith_items(), humaneval_rows())
    listed = mirror / "multiarith/MultiArith.json"
    good_sha = hashlib.sha256(listed.read_bytes()).hexdigest()
    _publish(mirror, {"multiarith/MultiArith.json": good_sha})
    assert load_benchmark("multiarith", mirror=mirror, use_hub=False).source == f"mirror:{mirror}"
    assert load_benchmark("humaneval", mirror=mirror, use_hub=False).source == f"mirror:{mirror}"  # not listed

    before = snapshot(prepared)
    listed.write_text(json.dumps([{**r, "lSolutions": [r["lSolutions"][0] + 1]} for r in multiarith_items()]))
    bad_sha = hashlib.sha256(listed.read_bytes()).hexdigest()
    assert run_cli(mirror=mirror, out=prepared, report_dir=tmp_path / "r") == 2
    err = _one_line_error(capsys)
    assert f"{listed}: sha256 {bad_sha[:12]}... differs from {good_sha[:12]}..." in err
    assert "the mirror was modified or is corrupt" in err and snapshot(prepared) == before


@pytest.mark.skipif(not (MIRROR / "MANIFEST.json").is_file(), reason=f"no mirror at {MIRROR}")
def test_the_real_mirror_manifest_catches_an_edited_question(tmp_path: Path) -> None:
    copy = tmp_path / "mirror"
    shutil.copytree(MIRROR / "aqua", copy / "aqua")
    shutil.copy(MIRROR / "MANIFEST.json", copy / "MANIFEST.json")
    assert load_benchmark("aqua", mirror=copy, use_hub=False).input_sha256 == load_benchmark(
        "aqua", mirror=MIRROR, use_hub=False).input_sha256
    test = copy / "aqua/test.json"
    test.chmod(0o644)
    test.write_text(test.read_text().replace('"question": "', '"question": "MODIFIED ', 1))
    with pytest.raises(DataError, match=r"aqua/test\.json: sha256 .* the mirror was modified or is corrupt"):
        load_benchmark("aqua", mirror=copy, use_hub=False)


# ------------------------------------------------------------------ D13: smaller refusals, one line


def test_a_manifest_that_is_a_folder_is_refused_before_writing(tmp_path: Path, capsys) -> None:
    mirror, out = write_mirror(tmp_path / "m", multiarith_items()), tmp_path / "out"
    (out / "manifest.json").mkdir(parents=True)
    assert run_cli(mirror=mirror, out=out, report_dir=tmp_path / "r") == 2
    assert f"{out / 'manifest.json'}: exists and is not a regular file" in _one_line_error(capsys)
    assert not (out / "multiarith").exists()


def test_a_corrupt_manifest_is_refused_not_rebuilt(prepared: Path, tmp_path: Path, capsys) -> None:
    (prepared / "manifest.json").write_text("{broken")
    before = snapshot(prepared)
    mirror = write_mirror(tmp_path / "m", multiarith_items())
    assert run_cli(mirror=mirror, out=prepared, report_dir=tmp_path / "r") == 2
    err = _one_line_error(capsys)
    assert f"{prepared / 'manifest.json'}:1: corrupt manifest" in err and "delete it and re-run" in err
    assert snapshot(prepared) == before  # humaneval's entry is not silently dropped


@pytest.mark.parametrize("kind", ["fifo", "loop", "device", "dangling"])
def test_a_mirror_file_that_is_not_a_regular_file_is_named_so(tmp_path: Path, kind: str) -> None:
    (tmp_path / "aqua").mkdir()
    (tmp_path / "aqua/dev.json").write_text("")
    test = tmp_path / "aqua/test.json"
    if kind == "fifo":
        os.mkfifo(test)
    elif kind == "loop":
        test.symlink_to(test)
    elif kind == "device":
        test.symlink_to("/dev/null")
    else:
        test.symlink_to(tmp_path / "nowhere")
    what = {"fifo": "a FIFO", "loop": "a symlink loop", "device": "a character device", "dangling": "a dangling"}[kind]
    with pytest.raises(DataError, match=re.escape(f"aqua: mirror file {test} is not a regular file: it is {what}")):
        load_benchmark("aqua", mirror=tmp_path, use_hub=False)


def test_a_repeated_benchmark_is_refused(tmp_path: Path, capsys) -> None:
    mirror = write_mirror(tmp_path / "m", multiarith_items())
    assert run_cli(mirror=mirror, out=tmp_path / "out", report_dir=tmp_path / "r",
                   benchmarks="multiarith,multiarith") == 2
    assert "multiarith listed more than once" in _one_line_error(capsys)
    assert not (tmp_path / "out").exists()
    with pytest.raises(UserError, match="multiarith listed more than once"):
        prepare(["multiarith", "multiarith"], mirror=mirror, out_dir=tmp_path / "out", data=OFFLINE, progress=False)
