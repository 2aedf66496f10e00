"""Two "nodes" on 127.0.0.1 through the real CLI: torchrun started once per node, and the DeepSpeed
launcher starting both nodes from a hostfile.

* torchrun: two ``agent-gspo train`` processes with ``NODE_RANK`` 0/1 and ``MASTER_ADDR`` (what one
  runs on each node), one rank each, DeepSpeed ZeRO-3: the run must also write the final model
  and exit, which needs every rank in the final parameter gather.
* DeepSpeed launcher: ``pdsh`` and ``ssh`` are replaced by scripts that run each node's command
  in an empty environment (``env -i``, as a fresh remote login would), so the run only succeeds
  if the project's settings (here the params file and profile, given only as ``AGENT_GSPO_*``
  variables) reach the ranks through the launcher's env file.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.paths import REPO_ROOT

from components.runtime.distributed import free_port

pytestmark = [pytest.mark.slow, pytest.mark.integration]
ROOT = REPO_ROOT
TIMEOUT_S = 600
TRAIN = {"model": {"name": "tiny-random"},
         "gspo": {"steps": 2, "checkpoint_every": 1, "questions_per_step": 2, "group_size": 2, "minibatches": 2,
                  "lr": 1e-3},
         "mas": {"agents": 2, "rounds": 1, "max_message_tokens": 8}}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK",
                        "AGENT_GSPO_PROFILE", "AGENT_GSPO_PARAMS")}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": "",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))})
    env.update(extra)
    return env


def _wait(procs: list[subprocess.Popen]) -> list[str]:
    logs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for p in procs:
                os.killpg(p.pid, signal.SIGKILL)
            pytest.fail(f"multi-node run timed out after {TIMEOUT_S}s")
        logs.append(out)
    for proc, log in zip(procs, logs, strict=True):
        assert proc.returncode == 0, f"exit {proc.returncode}:\n{log[-5000:]}"
    return logs


def _check_run(out: Path) -> None:
    assert (out / "final" / "model.safetensors").is_file()
    meta = json.loads((out / "checkpoints" / "step-000002" / "meta.json").read_text())
    assert meta["world_size"] == 2
    assert json.loads((out / "metrics.json").read_text())["steps"] == 2


def test_torchrun_one_command_per_node_zero3(prepared_data: Path, tmp_path: Path) -> None:
    out, port = tmp_path / "run", free_port()
    sets = {**{f"{s}.{k}": v for s, kv in TRAIN.items() for k, v in kv.items()},
            "data.out_dir": prepared_data, "gspo.engine": "deepspeed", "deepspeed.zero_stage": 3,
            "deepspeed.launcher": "torchrun", "deepspeed.num_nodes": 2, "deepspeed.nproc_per_node": 1,
            "deepspeed.master_port": port}
    cmd = [sys.executable, "-m", "components.cli", "train", "--no-track", "--out", str(out)]
    cmd += [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=_env(NODE_RANK=str(node), MASTER_ADDR="127.0.0.1"),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for node in (0, 1)]
    logs = _wait(procs)
    assert "--node_rank=0" in logs[0] and "--node_rank=1" in logs[1]
    assert "step 2/2" in logs[0]
    _check_run(out)


FAKE_PDSH = r"""#!/usr/bin/env bash
# pdsh -S -f N -w host1,host2 CMD...: run CMD once per host (%n = its index) in an empty environment
hosts=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    -w) hosts="$2"; shift 2 ;;
    -f) shift 2 ;;
    -S) shift ;;
    *) break ;;
  esac
done
cmd="$*"
printf '%s\n' "$cmd" >"$FAKE_PDSH_LOG"
IFS=, read -ra names <<<"$hosts"
pids=()
for i in "${!names[@]}"; do
  env -i PATH="$PATH" HOME="$HOME" bash -c "${cmd//%n/$i}" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit "$rc"
"""

FAKE_SSH = r"""#!/usr/bin/env bash
# ssh [-o opt] [-p port] host CMD...: run CMD here
while [[ "$1" == -* ]]; do shift 2; done
shift
exec "$@"
"""


def test_deepspeed_hostfile_launch_forwards_the_environment(prepared_data: Path, tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("pdsh", FAKE_PDSH), ("ssh", FAKE_SSH)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a slots=1\nnode-b slots=1\n")
    out, port = tmp_path / "run", free_port()
    profile = {**TRAIN, "data": {"out_dir": str(prepared_data)}, "gspo": {**TRAIN["gspo"], "engine": "torch"},
               "deepspeed": {"launcher": "deepspeed", "num_nodes": 2, "nproc_per_node": 1,
                             "hostfile": str(hostfile), "master_port": port}}
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"profiles": {"twonode": profile}}))
    pdsh_log = tmp_path / "pdsh.log"
    env = _env(AGENT_GSPO_PARAMS=str(params), AGENT_GSPO_PROFILE="twonode", MASTER_ADDR="127.0.0.1",
               HF_HUB_OFFLINE="1", FAKE_PDSH_LOG=str(pdsh_log), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.Popen([sys.executable, "-m", "components.cli", "train", "--no-track", "--out", str(out)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    (log,) = _wait([proc])
    remote = pdsh_log.read_text()
    for assignment in (f"AGENT_GSPO_PARAMS={params}", "AGENT_GSPO_PROFILE=twonode", "HF_HUB_OFFLINE=1",
                       "TRANSFORMERS_OFFLINE=1", "DS_ACCELERATOR=cpu", "OMP_NUM_THREADS=1"):
        assert f"export {assignment};" in remote, assignment
    assert "step 2/2" in log
    _check_run(out)
    assert not (ROOT / ".deepspeed_env").exists()  # the env file was temporary, not left in the checkout
