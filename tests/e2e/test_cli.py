"""The `agent-gspo` CLI end to end on real prepared data: score, rollout, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT, find_under_tests

from components.data.prepare import load_split

pytestmark = pytest.mark.e2e
ROOT = REPO_ROOT


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "components.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))


@pytest.fixture(scope="module")
def data_dir(prepared_data: Path) -> Path:
    return prepared_data


def test_score_gold_solutions_is_100_percent(data_dir, tmp_path):
    preds = tmp_path / "preds.jsonl"
    records = load_split(data_dir, "gsm8k", "test")
    preds.write_text("".join(json.dumps({"id": r.id, "prediction": r.meta["solution"]}) + "\n" for r in records))
    out = tmp_path / "scored.jsonl"
    res = _cli("score", "--benchmark", "gsm8k", "--predictions", str(preds), "--data", str(data_dir), "--out", str(out))
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["n"] == 1319 and summary["correct"] == 1319
    first = json.loads(out.read_text().splitlines()[0])
    assert set(first) == {"id", "correct", "extracted", "error"}


def test_score_malformed_line_exits_2_naming_file_and_line(data_dir, tmp_path):
    preds = tmp_path / "bad.jsonl"
    preds.write_text('{"id": "aqua/test/0", "prediction": "The answer is (A)"}\n{not json\n')
    res = _cli("score", "--benchmark", "aqua", "--predictions", str(preds), "--data", str(data_dir))
    assert res.returncode == 2
    assert "bad.jsonl" in res.stderr and "2" in res.stderr


def test_rollout_prints_transcript_and_writes_records(data_dir, tmp_path):
    out = tmp_path / "episodes.jsonl"
    res = _cli("rollout", "--benchmark", "gsm8k", "--limit", "2", "--agents", "3", "--rounds", "2",
               "--data", str(data_dir), "--set", "model.name=tiny-random", "--set", "mas.max_message_tokens=8",
               "--json", str(out))
    assert res.returncode == 0, res.stderr
    assert "round 2" in res.stdout and "communicated" in res.stdout
    episodes = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(episodes) == 2 and all(len(e["messages"]) == 6 for e in episodes)
    for e in episodes:  # Σ k·r over non-silent messages
        assert e["communicated_tokens"] == sum(len(m["completion_ids"]) * len(m["recipients"])
                                               for m in e["messages"] if not m["silent"])


def test_rollout_applies_the_silence_prior_only_when_asked(data_dir):
    """Was: model.silence_prior silently ignored (the profiles that set it trained another policy than
    `rollout` showed). Now `--silence-prior` gives the step-0 policy, and without it a note says so."""
    base = ("rollout", "--benchmark", "gsm8k", "--limit", "4", "--group-size", "2", "--data", str(data_dir),
            "--set", "model.name=tiny-random", "--set", "mas.max_message_tokens=8", "--set", "model.silence_prior=0.9")
    with_prior, without = _cli(*base, "--silence-prior"), _cli(*base)
    assert with_prior.returncode == 0 and without.returncode == 0, with_prior.stderr + without.stderr
    assert "silence prior: P(silence first) = 0.9" in with_prior.stderr
    assert "model.silence_prior 0.9 is applied by `train` at step 0" in without.stderr

    def rate(res: subprocess.CompletedProcess) -> float:
        return json.loads(res.stdout[res.stdout.rindex("\n{"):])["silence_rate"]

    assert rate(with_prior) > 0.6 and rate(without) < 0.2


def test_bad_input_exits_2(tmp_path):
    res = _cli("train", "--set", "gspo.eps_lo=0.1")
    assert res.returncode == 2 and "gspo.eps_lo: unknown key" in res.stderr
    res = _cli("prepare", "--benchmarks", "gsm9k")
    assert res.returncode == 2 and "gsm9k" in res.stderr
    res = _cli("validate", "--data", str(tmp_path / "missing"))
    assert res.returncode == 2 and "missing" in res.stderr


def _sqlite_registry(tmp_path: Path, request) -> str:
    import importlib.util
    import shutil

    spec = importlib.util.spec_from_file_location("test_tracking_helpers", find_under_tests("test_tracking_helpers.py"))
    helpers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helpers)
    db = tmp_path / "mlflow.db"
    shutil.copy(helpers.template_db(Path(request.config.cache.mkdir("agent-gspo-mlflow"))), db)
    return f"sqlite:///{db}"


def test_unknown_registry_model_exits_2_with_one_line(tmp_path, request):
    uri = _sqlite_registry(tmp_path, request)
    for args in (["evaluate", "--model", "models:/nope@champion"], ["promote", "--candidate", "models:/nope/3"],
                 ["promote", "--candidate", "models:/nope"]):
        res = _cli(*args, "--set", f"tracking.uri={uri}", cwd=tmp_path)
        lines = [line for line in res.stderr.splitlines() if line.startswith("agent-gspo")]
        assert res.returncode == 2, res.stderr[-2000:]
        assert "Traceback" not in res.stderr and len(lines) == 1, res.stderr[-2000:]
        assert "no registered model 'nope'" in lines[0] and uri in lines[0], lines


def test_unreachable_registry_fails_fast_with_a_clear_error(tmp_path):
    """A refused connection and a server that accepts but never answers: exit 2 within seconds, not minutes."""
    import socket
    import time

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections (kernel backlog) and never answers
    refused = socket.socket()
    refused.bind(("127.0.0.1", 0))
    port = refused.getsockname()[1]
    refused.close()
    try:
        for url in (f"http://127.0.0.1:{port}", f"http://127.0.0.1:{silent.getsockname()[1]}"):
            t0 = time.monotonic()
            res = _cli("promote", "--set", f"tracking.uri={url}", cwd=tmp_path)
            took = time.monotonic() - t0
            assert res.returncode == 2 and "unreachable" in res.stderr and url in res.stderr, res.stderr[-2000:]
            assert took < 60, took  # process start (~5-10 s on 2 busy cores) + the 5 s /health probe
    finally:
        silent.close()
