"""`agent-gspo run` without a Prefect server, interrupted the way a terminal does it: Ctrl-C signals
the whole process group. Was: the temporary Prefect server died with the group, the flow retried for
~150 s to report to it, and the run ended with exit 1 and connection tracebacks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.integration]
ROOT = REPO_ROOT
MIRROR = Path(os.environ.get("AGENT_GSPO_DATA_MIRROR", ROOT.parent / "shared" / "benchmarks"))


def _uvicorn_on(port: str) -> list[str]:
    out = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "uvicorn" in line and f"--port {port}" in line]


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_to_the_group_of_run_is_130_and_one_line(tmp_path: Path, sig: signal.Signals, code: int) -> None:
    sets = ["model.name=tiny-random", "gspo.engine=torch", "gspo.steps=400", "gspo.questions_per_step=2",
            "gspo.group_size=2", "gspo.minibatches=2", "gspo.checkpoint_every=50", "mas.agents=2", "mas.rounds=1",
            "mas.max_message_tokens=8", "data.benchmarks=[gsm8k]", "eval.benchmarks=[gsm8k]", "eval.limit=1",
            f"data.out_dir={tmp_path / 'data'}", f"data.report_dir={tmp_path / 'reports'}",
            f"gspo.out_dir={tmp_path / 'run'}", f"eval.out_dir={tmp_path / 'eval'}",
            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update({"PREFECT_HOME": str(tmp_path / "prefect"), "AGENT_GSPO_DATA_MIRROR": str(MIRROR),
                "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    cmd = [sys.executable, "-m", "components.cli", "run", *[a for s in sets for a in ("--set", s)]]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own group: a terminal's foreground job
    assert proc.stdout is not None
    lines, port = [], ""
    for line in proc.stdout:
        lines.append(line)
        if "Starting temporary server on http://127.0.0.1:" in line:
            port = line.rsplit(":", 1)[1].strip().split()[0]
        if "step 2/400" in line:
            break
    assert port and _uvicorn_on(port), "".join(lines)[-3000:]
    sent = time.monotonic()
    os.killpg(proc.pid, sig)  # what Ctrl-C does: the whole foreground process group
    rest, _ = proc.communicate(timeout=120)
    took = time.monotonic() - sent
    text = "".join(lines) + rest
    assert proc.returncode == code, text[-4000:]
    assert took < 30, f"{took:.0f} s to stop: {rest[-3000:]}"
    assert f"agent-gspo run: interrupted ({sig.name})" in rest and "ConnectError" not in rest, rest[-4000:]
    time.sleep(1)
    assert not _uvicorn_on(port)  # the temporary server never outlives the run
