"""Two CPU processes (gloo) under torchrun and under the deepspeed launcher, both engines.

Launch commands that work on CPU (documented for the README / infra):

* ``python -m torch.distributed.run --nproc_per_node 2 --master_addr 127.0.0.1 --master_port P worker.py``
* ``DS_ACCELERATOR=cpu python -m deepspeed.launcher.runner --num_gpus 2 --master_port P worker.py``
  (same as the ``deepspeed --num_gpus 2`` entry point; on CPU ``--num_gpus`` just means
  "processes on this node"; the launcher appends ``--local_rank=N`` to the worker's arguments).

Each run trains the torch engine (one micro-batch per update, and two: its bucketed all-reduce
starts during the last micro-batch's backward), DeepSpeed ZeRO-2 and ZeRO-3 for 3 updates on
rank-sharded data. The test asserts both ranks end with identical weights, that they started identical although
each rank seeded its model differently (rank 0's weights were broadcast), that a collective
checkpoint reloads to the same weights, and that the result equals a single-process reference
trained on the union of the shards (so gradients really were averaged across ranks).
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import dist_worker
from helpers.paths import REPO_ROOT

from components.config_sections import GspoConfig
from components.runtime.distributed import free_port

REPO = REPO_ROOT
WORKER = Path(dist_worker.__file__)
ENGINES = "torch,torch:0:2,deepspeed:2,deepspeed:3"
TIMEOUT_S = 420

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _launch(cmd: list[str], out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT",
                                                           "MASTER_ADDR", "LOCAL_WORLD_SIZE")}
    env.update({"DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))})
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and both ranks: a hang must fail, not block CI
        log, _ = proc.communicate()
        pytest.fail(f"distributed run timed out after {TIMEOUT_S}s:\n{log[-4000:]}")
    assert proc.returncode == 0, f"launcher exited {proc.returncode}:\n{log[-6000:]}"
    result = out / "result.json"
    assert result.is_file(), f"no result.json:\n{log[-4000:]}"
    return json.loads(result.read_text())


def _reference_weights() -> dict[str, torch.Tensor]:
    """One process, torch engine, loss over both shards' rows: what averaged gradients must give."""
    w = dist_worker
    from components.runtime.engines import TorchEngine

    eng = TorchEngine(w.tiny_model(100), GspoConfig(lr=1e-2, grad_clip=1.0, lr_schedule="cosine", warmup_steps=1),
                      total_steps=w.STEPS)
    for step in range(w.STEPS):
        ids = torch.cat([w.step_items(step, r, 2) for r in range(2)])  # [4, SEQ], shards are equal-sized
        eng.update([(int(ids.shape[0]), lambda ids=ids: eng.module(input_ids=ids, labels=ids).loss)])
    return {k: v.detach().float().clone() for k, v in eng.module.state_dict().items()}


def _check(payload: dict, out: Path) -> None:
    reference = _reference_weights()
    assert payload["env"]["WORLD_SIZE"] == "2"
    assert [f"{r['engine']}{r['zero_stage']}/{r['grad_accum']}" for r in payload["results"]] == [
        "torch0/1", "torch0/2", "deepspeed2/1", "deepspeed3/1"]
    for r in payload["results"]:
        name = f"{r['engine']} zero={r['zero_stage']} grad_accum={r['grad_accum']}"
        assert r["world_size"] == 2 and r["ranks_seen"] == [0, 1], name
        assert len(set(r["start_digests"])) == 1, f"{name}: ranks started from different weights"
        assert len(set(r["final_digests"])) == 1, f"{name}: ranks diverged"
        assert r["reloaded_digests"] == r["final_digests"], f"{name}: checkpoint reload differs"
        assert r["losses_per_rank"][0] != r["losses_per_rank"][1], f"{name}: ranks saw the same data"
        assert r["optimizer_steps"] == 3 and r["extra_loaded"] == {"losses": r["losses_per_rank"][0]}
        spec = ("torch" if r["grad_accum"] == 1 else "torch-0-2") if r["engine"] == "torch" \
            else f"deepspeed-{r['zero_stage']}"
        final = torch.load(out / spec / "weights.pt", weights_only=True)
        for key, ref in reference.items():
            torch.testing.assert_close(final[key], ref, rtol=1e-4, atol=1e-5, msg=f"{name}: {key}")


def _no_shm_buffer_left(port: int) -> None:
    """DeepSpeed's CPU comm layer leaves a 66 MB /dev/shm buffer per rank; our shutdown removes them."""
    left = glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_{port}_*")
    assert not left, f"tmpfs buffers left behind (RAM): {left}"


def test_torchrun_two_ranks(tmp_path: Path) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(port), str(WORKER), "--engines", ENGINES, "--out", str(tmp_path)]
    _check(_launch(cmd, tmp_path), tmp_path)
    _no_shm_buffer_left(port)


def test_deepspeed_launcher_two_ranks(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    port = free_port()
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(port), str(WORKER), "--engines", ENGINES, "--out", str(tmp_path)]
    _check(_launch(cmd, tmp_path), tmp_path)
    _no_shm_buffer_left(port)
