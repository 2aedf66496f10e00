"""Ctrl-C and SIGTERM on a training launched under torchrun: exit 130 / 143 with one line, no
launcher traceback, no process left (docs/pipeline.md: "Ctrl-C exits 130 and SIGTERM 143 with one line").
Was: torchrun's SignalException traceback (two chained ones on Ctrl-C) and the rank's own
"interrupted" line before the CLI's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT
from helpers.servers import free_port, group_gone

pytestmark = [pytest.mark.slow, pytest.mark.integration]
ROOT = REPO_ROOT


def _train(data_dir: Path, out: Path, port: int, launcher: str = "torchrun") -> subprocess.Popen:
    sets = [f"data.out_dir={data_dir}", "model.name=tiny-random", "gspo.steps=500", "gspo.questions_per_step=2",
            "gspo.group_size=2", "mas.agents=2", "mas.rounds=1", "mas.max_message_tokens=8",
            f"deepspeed.launcher={launcher}", "deepspeed.nproc_per_node=1", f"deepspeed.master_port={port}"]
    cmd = [sys.executable, "-m", "components.cli", "train", "--no-track", "--out", str(out),
           *[a for s in sets for a in ("--set", s)]]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("AGENT_GSPO_PARENT_REPORTS_INTERRUPT", None)
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _wait_for_training(out: Path, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    """Until the rank has written its first checkpoint (so it is past start-up and training)."""
    deadline = time.monotonic() + timeout
    while not list((out / "checkpoints").glob("step-*")):
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"training did not start: rc={proc.returncode}\n{proc.communicate()[1][-3000:]}")
        time.sleep(0.5)


@pytest.mark.parametrize(("sig", "to_group", "code", "name"), [
    (signal.SIGINT, True, 130, "SIGINT"),    # Ctrl-C: the terminal signals the whole foreground group
    (signal.SIGTERM, False, 143, "SIGTERM"),  # a scheduler stopping the command it started
])
def test_an_interrupted_torchrun_training_ends_with_one_line(prepared_data, tmp_path, sig, to_group, code, name):
    out = tmp_path / "run"
    proc = _train(prepared_data, out, free_port())
    try:
        _wait_for_training(out, proc)
        (os.killpg if to_group else os.kill)(proc.pid, sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == code, err[-3000:]
    assert "Traceback" not in err and "SignalException" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if ": interrupted (" in line]
    assert lines == [f"agent-gspo train: interrupted ({name}); `--resume` continues from the newest checkpoint"], err
    assert group_gone(proc.pid), "the command exited with its launcher or rank still running"


def test_ctrl_c_on_a_deepspeed_launch_returns_after_every_launched_process(prepared_data, tmp_path):
    """Was: the DeepSpeed runner exited on Ctrl-C at once, and its `launch.py` (stopping the rank)
    outlived the command by ~2.8 s: a `--resume` typed right away raced the old training."""
    out = tmp_path / "run"
    proc = _train(prepared_data, out, free_port(), launcher="deepspeed")
    try:
        _wait_for_training(out, proc)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        gone = group_gone(proc.pid)  # at once: nothing may be left when the command has returned
    finally:
        if proc.poll() is None or not group_gone(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-3000:]
    assert gone, "the command exited with DeepSpeed's launch.py or the rank still running"
    assert "Traceback" not in err, err[-3000:]
