"""SIGTERM to ``dvc repro`` stops the stage it runs (docs/reproducibility.md). DVC runs a stage as
``$SHELL -c "<cmd>"`` and dies on SIGTERM without passing it on: the training it started ran on as
an orphan. Now the stage sees its ``dvc`` go and unwinds as on SIGTERM (exit 143, one line). Both
shells DVC may use: bash execs the command (dvc is its parent), dash stays in between."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT
from helpers.servers import group_gone

pytestmark = [pytest.mark.slow, pytest.mark.integration]
ROOT = REPO_ROOT


def _stage_repo(repo: Path, data_dir: Path, out: Path) -> None:
    """A DVC project (no git) whose one stage trains the tiny model for far longer than the test waits."""
    subprocess.run(["dvc", "init", "--no-scm", "-q"], cwd=repo, check=True)
    sets = [f"data.out_dir={data_dir}", "model.name=tiny-random", "gspo.steps=5000", "gspo.questions_per_step=1",
            "gspo.group_size=2", "mas.agents=2", "mas.rounds=1", "mas.max_message_tokens=8"]
    cmd = " ".join([sys.executable, "-m", "components.cli", "train", "--no-track", "--params",
                    str(ROOT / "params.yaml"), "--out", str(out), *[f"--set {s}" for s in sets]])
    (repo / "dvc.yaml").write_text(f"stages:\n  train:\n    cmd: {cmd}\n    outs:\n      - {out.name}\n")


@pytest.mark.parametrize("shell", ["/bin/bash", "/bin/sh"])
def test_sigterm_to_dvc_stops_the_stage_it_runs(prepared_data: Path, tmp_path: Path, shell: str) -> None:
    if not Path(shell).exists() or shutil.which("dvc") is None:
        pytest.skip(f"needs {shell} and dvc")
    repo = tmp_path / "repo"
    repo.mkdir()
    out = repo / "run"
    _stage_repo(repo, prepared_data, out)
    env = dict(os.environ, SHELL=shell, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    dvc = subprocess.Popen(["dvc", "repro"], cwd=repo, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not list((out / "checkpoints").glob("step-*")):  # training, past start-up
            if dvc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the stage did not start training: rc={dvc.returncode}\n{dvc.communicate()[0][-3000:]}")
            time.sleep(0.5)
        dvc.send_signal(signal.SIGTERM)  # dvc alone, as a scheduler or `kill <pid>` would
        text, _ = dvc.communicate(timeout=60)  # the pipe closes once the stage (which shares it) has exited
        for _ in range(100):
            if group_gone(dvc.pid):
                break
            time.sleep(0.2)
        assert group_gone(dvc.pid), "the stage outlived its dvc"
    finally:
        if not group_gone(dvc.pid):
            os.killpg(dvc.pid, signal.SIGKILL)
    assert "is gone: stopping" in text and "agent-gspo train: interrupted (SIGTERM)" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
