"""bench/gpu.sh and bench/gpu_train.py stay runnable off the GPU (the CPU logic-check path)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_sh_parses_and_says_what_must_travel() -> None:
    script = ROOT / "bench" / "gpu.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    out = subprocess.run(["bash", str(script), "--travel"], capture_output=True, text=True, check=True).stdout
    assert "DS_BUILD_OPS=0" in out and "deepspeed==0.19.8" in out
    for wheel in ("pydantic==", "pydantic-core==", "hjson==", "datasets==5.0.1", "dill==", "multiprocess==", "trl=="):
        assert wheel in out, wheel


@pytest.mark.slow
@pytest.mark.parametrize("static_cache", [False, True])
def test_gpu_train_cpu_logic_check(tmp_path: Path, static_cache: bool) -> None:
    """The trainer end to end through DeepSpeed ZeRO-2 (one rank, CPU, tiny-random): finite losses,
    changed weights, a final model; the same script runs the SmolLM2-shape model on the GPU. With
    the static cache, its greedy episodes equal the dynamic cache's (gpu.sh's static_cache part)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        env.pop(key, None)
    res = subprocess.run([sys.executable, "bench/gpu_train.py", "--device", "cpu", "--model", "tiny-random",
                          "--steps", "2", "--questions", "2", "--group", "2", "--rounds", "1", "--tokens", "8",
                          "--out", str(tmp_path), "--set", f"mas.static_cache={str(static_cache).lower()}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "all passed" in res.stdout and "gpu_train:" in res.stdout
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
    if static_cache:
        line = next(x for x in res.stdout.splitlines() if x.startswith("static_cache:"))
        n = line.split()[1].split("/")
        assert n[0] == n[1] and int(n[0]) > 0, line
