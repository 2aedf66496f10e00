"""An evaluation publishes its outputs as one set, or none (components/evaluation/publish.py).

evaluate() runs with the injected fake engines of test_evaluation_runner (no torch); a write of one
output fails with ENOSPC (the hostile run on a 3 MB tmpfs), or the process is killed mid-publish."""
import contextlib
import errno
import os
from pathlib import Path

import pytest
from helpers.paths import load_test_module

import components.io
import components.plotting
from components.evaluation.plots import plot_accuracy_vs_tokens, plot_silence_heatmap
from components.evaluation.publish import OUTPUT_NAMES, check_out_dir, publish
from components.evaluation.report import write_reports
from components.evaluation.runner import EvalRequest, System, evaluate

FakeEngine = load_test_module("test_evaluation_runner").FakeEngine
_cfg = load_test_module("test_evaluation_runner")._cfg
make_eval_data = load_test_module("test_evaluation_runner").make_eval_data

NAMES = ["gsm8k.json", "aqua.json", "summary.json", "report.md", "accuracy_vs_tokens.png",
         "silence_by_agent_round.png", "items.jsonl"]


@pytest.fixture
def data(tmp_path):
    return make_eval_data(tmp_path)


def _run(data, out, limit, benchmarks=("gsm8k", "aqua")):
    return evaluate(_cfg(benchmarks=list(benchmarks)), EvalRequest(limit=limit, data_dir=data, out_dir=out),
                    systems=[System("agent_gspo", FakeEngine()), System("single_cot", FakeEngine(right=False))])


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every entry under ``root`` (hidden ones too): file bytes, None for a folder."""
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


def _foreign(out: Path) -> None:
    """What else may live in the output folder: the proof's baselines evaluation, a --metrics file."""
    (out / "baselines").mkdir()
    (out / "baselines" / "summary.json").write_text('{"keep": 1}\n')
    (out / "metrics.json").write_text('{"accuracy": 0.5}\n')


def test_normal_run_writes_the_same_files_as_before(data, tmp_path):
    rep = _run(data, tmp_path / "eval", 3)
    legacy = tmp_path / "legacy"  # what evaluate wrote before, file by file into the folder
    write_reports(legacy, rep.table, rep.summary, rep.meta, rep.markdown)
    plot_accuracy_vs_tokens(rep.table, legacy / "accuracy_vs_tokens.png")
    plot_silence_heatmap(rep.silence, legacy / "silence_by_agent_round.png")
    (legacy / "items.jsonl").write_bytes((tmp_path / "eval" / "items.jsonl").read_bytes())  # the per-item record
    assert _tree(tmp_path / "eval") == _tree(legacy)  # same names, same bytes, nothing else (no lock, no staging)
    assert set(_tree(legacy)) == set(NAMES)
    assert rep.paths == {"gsm8k": tmp_path / "eval" / "gsm8k.json", "aqua": tmp_path / "eval" / "aqua.json",
                         "summary": tmp_path / "eval" / "summary.json", "report": tmp_path / "eval" / "report.md",
                         "accuracy_vs_tokens": tmp_path / "eval" / "accuracy_vs_tokens.png",
                         "silence_by_agent_round": tmp_path / "eval" / "silence_by_agent_round.png",
                         "items": tmp_path / "eval" / "items.jsonl"}
    assert list(rep.paths) == ["gsm8k", "aqua", "summary", "report", "items", "accuracy_vs_tokens",
                               "silence_by_agent_round"]
    mode = 0o666 & ~_umask()
    assert all((tmp_path / "eval" / n).stat().st_mode & 0o777 == mode for n in NAMES)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("failing", NAMES)
def test_a_failed_write_leaves_the_previous_outputs_byte_identical(data, tmp_path, monkeypatch, failing):
    out = tmp_path / "eval"
    _run(data, out, 2)
    _foreign(out)
    before = _tree(out)
    real = components.io.atomic_path

    @contextlib.contextmanager
    def disk_full(target, suffix=""):  # the file is written, then the disk is full (as PIL's write was)
        with real(target, suffix) as tmp:
            yield tmp
            if Path(target).name == failing:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(components.io, "atomic_path", disk_full)  # JSON and markdown writers
    monkeypatch.setattr(components.plotting, "atomic_path", disk_full)  # save_png
    with pytest.raises(OSError) as caught:
        _run(data, out, 4)
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(out)
    assert str(caught.value) == f"[Errno 28] No space left on device: '{out}'"
    assert _tree(out) == before  # the limit-2 set, byte for byte; no staging folder or temporary file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "eval"]  # nothing beside it either

    monkeypatch.undo()
    rep = _run(data, out, 4)  # the next run publishes its whole set; what else lives there stays
    after = _tree(out)
    assert {k for k in after if not k.startswith(("baselines", "metrics.json"))} == set(NAMES)
    assert all(after[k] == before[k] for k in ("baselines", "baselines/summary.json", "metrics.json"))
    assert all(after[n] != before[n] for n in ("summary.json", "report.md", "gsm8k.json"))
    assert rep.table[0].n == 4 and b'"limit": 4' in after["summary.json"]


def test_a_failing_plot_aborts_before_anything_moves(data, tmp_path, monkeypatch):
    out = tmp_path / "eval"
    _run(data, out, 2)
    before = _tree(out)

    def broken(*args, **kwargs):
        raise RuntimeError("no plot today")

    monkeypatch.setattr("components.evaluation.plots.save_png", broken)
    with pytest.raises(RuntimeError, match="no plot today"):
        _run(data, out, 4)
    assert _tree(out) == before


def test_a_new_set_replaces_the_whole_previous_set(data, tmp_path):
    out = tmp_path / "eval"
    _run(data, out, 2)
    assert (out / "aqua.json").is_file()
    _run(data, out, 2, benchmarks=["gsm8k"])  # aqua.json belonged to the previous set: it goes with it
    assert sorted(p.name for p in out.iterdir()) == sorted(n for n in NAMES if n != "aqua.json")


def _old_set(out: Path) -> dict[str, bytes]:
    out.mkdir(parents=True, exist_ok=True)
    for name in ("summary.json", "report.md", "mmlu.json", "accuracy_vs_tokens.png"):
        (out / name).write_bytes(f"old {name}\n".encode())
    (out / "notes.txt").write_text("not ours\n")
    return _tree(out)


def _write_new(staging: Path) -> dict[str, Path]:
    paths = {}
    for key, name in (("gsm8k", "gsm8k.json"), ("summary", "summary.json"), ("report", "report.md"),
                      ("accuracy_vs_tokens", "accuracy_vs_tokens.png")):
        components.io.write_text_atomic(staging / name, f"new {name}\n")
        paths[key] = staging / name
    return paths


def _dying_replace(k: int):
    """os.replace that ends the process (no cleanup, like SIGKILL) instead of its k-th rename."""
    calls, replace = [0], os.replace

    def dying(src, dst):
        calls[0] += 1
        if calls[0] == k:
            os._exit(9)
        replace(src, dst)

    return dying


def test_a_killed_publish_leaves_the_previous_set_after_recovery(tmp_path):
    """The process dies (os._exit, no cleanup) at every rename of the publish in turn; the next
    evaluation's check of the folder restores the previous set and removes the leftovers."""
    killed_at = []
    for k in range(1, 100):
        out = tmp_path / f"k{k}" / "eval"
        before = _old_set(out)
        pid = os.fork()
        if pid == 0:  # child: die at the k-th rename
            try:
                os.replace = _dying_replace(k)
                publish(out, _write_new)
                os._exit(0)
            finally:
                os._exit(3)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        assert code in (0, 9), code
        if code == 0:  # the k-th rename is past the end: the publish completed
            after = _tree(out)
            assert after == {"notes.txt": b"not ours\n", **{n: f"new {n}\n".encode() for n in
                             ("gsm8k.json", "summary.json", "report.md", "accuracy_vs_tokens.png")}}
            break
        killed_at.append(k)
        assert any(p.name.startswith(".evaluate-") for p in out.iterdir())  # what the killed run left
        check_out_dir(out)
        assert _tree(out) == before, k
    # killed at each staged write (4), the journal, each previous output moved out (4), each new one in (4)
    assert len(killed_at) == 4 + 1 + 4 + 4


def test_an_unusable_output_folder_fails_before_the_evaluation_runs(data, tmp_path):
    from components.errors import UserError

    (tmp_path / "file").write_text("x")
    engine = FakeEngine()
    with pytest.raises(UserError, match="evaluation output folder .* is not a folder"):
        evaluate(_cfg(), EvalRequest(limit=2, data_dir=data, out_dir=tmp_path / "file"), systems=[System("agent_gspo",
                 engine)])
    assert engine.calls == []


def test_output_names_match_the_report_layout():
    from components.config import ALL_BENCHMARKS

    assert set(NAMES) <= OUTPUT_NAMES and {f"{b}.json" for b in ALL_BENCHMARKS} <= OUTPUT_NAMES
