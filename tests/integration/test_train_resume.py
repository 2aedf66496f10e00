"""Training through the real entry points: SIGKILL + --resume equals an uninterrupted run, and
two CPU ranks under torchrun / the deepspeed launcher train one shared policy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.paths import REPO_ROOT
from helpers.servers import free_port
from safetensors.torch import load_file

pytestmark = [pytest.mark.slow, pytest.mark.integration]
ROOT = REPO_ROOT


@pytest.fixture(scope="module")
def data_dir(prepared_data: Path) -> Path:
    return prepared_data


def _overrides(data_dir: Path, steps: int = 4, engine: str = "torch") -> list[str]:
    sets = [f"data.out_dir={data_dir}", "model.name=tiny-random", f"gspo.engine={engine}", f"gspo.steps={steps}",
            "gspo.checkpoint_every=1", "gspo.keep_checkpoints=2", "gspo.questions_per_step=2", "gspo.group_size=2",
            "gspo.minibatches=2", "gspo.lr=1e-3", "mas.agents=2", "mas.rounds=1", "mas.max_message_tokens=8"]
    return [a for s in sets for a in ("--set", s)]


def _cmd(data_dir: Path, out: Path, *extra: str, engine: str = "torch") -> list[str]:
    return [sys.executable, "-m", "components.runtime.train_main", "--no-track", "--out", str(out),
            *_overrides(data_dir, engine=engine), *extra]


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "final" / "model.safetensors"))


def _history(out: Path) -> list[dict]:
    rows = json.loads((out / "history.json").read_text())
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


def test_sigkill_and_resume_equals_uninterrupted(data_dir, tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    subprocess.run(_cmd(data_dir, straight), check=True, cwd=ROOT, env=_env(), timeout=600)

    proc = subprocess.Popen(_cmd(data_dir, killed), cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("step 3/4"):  # checkpoint 2 is complete; 3 may be half-written
            os.killpg(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (killed / "final").exists()

    resumed = subprocess.run(_cmd(data_dir, killed, "--resume"), cwd=ROOT, env=_env(), timeout=600,
                             capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed from" in resumed.stderr
    a, b = _weights(straight), _weights(killed)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _history(straight) == _history(killed)


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_two_cpu_ranks_under_launcher(data_dir, tmp_path, launcher):
    out = tmp_path / launcher
    engine = "deepspeed" if launcher == "deepspeed" else "torch"
    cmd = [sys.executable, "-m", "components.cli", "train", "--no-track", "--out", str(out),
           *_overrides(data_dir, steps=2, engine=engine), "--set", f"deepspeed.launcher={launcher}",
           "--set", "deepspeed.nproc_per_node=2", "--set", "deepspeed.zero_stage=2",
           "--set", f"deepspeed.master_port={free_port()}"]
    res = subprocess.run(cmd, cwd=ROOT, env=_env(), timeout=900, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "step 2/2" in res.stdout
    assert (out / "final" / "model.safetensors").is_file()
    ckpt = json.loads((out / "checkpoints" / "step-000002" / "meta.json").read_text())
    assert ckpt["world_size"] == 2 and ckpt["engine"] == engine
