"""The GSPO trainer on 2 gloo ranks (torchrun, CPU): what gets logged is the all-rank mean, and a
world size that would leave a rank without questions is refused on every rank, without a hang."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import trainer_worker
from helpers.paths import REPO_ROOT

from components.runtime.distributed import free_port

pytestmark = [pytest.mark.slow, pytest.mark.integration]
REPO = REPO_ROOT
TIMEOUT_S = 300


def _run(out: Path, mode: str, *overrides: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT",
                                                           "MASTER_ADDR", "LOCAL_WORLD_SIZE")}
    env.update({"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), str(REPO / "tests"), env.get("PYTHONPATH")]))})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), trainer_worker.__file__, "--mode", mode, "--out", str(out)]
    cmd += [a for o in overrides for a in ("--set", o)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # a rank waiting in a collective must fail the test, not block CI
        log, _ = proc.communicate()
        pytest.fail(f"2-rank {mode} run timed out after {TIMEOUT_S}s (a rank hung in a collective?):\n{log[-4000:]}")
    assert proc.returncode == 0, f"torchrun exited {proc.returncode}:\n{log[-6000:]}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_logged_metrics_are_the_all_rank_means(tmp_path: Path) -> None:
    """Both ranks log the same numbers: episode metrics are means over both ranks' episodes, loss
    metrics the mean of the two ranks' own means, rollout throughput both ranks' tokens per second."""
    ranks = _run(tmp_path, "step", "gspo.grad_accum=2")
    assert [r["world_size"] for r in ranks] == [2, 2]
    m0, m1 = ranks[0]["metrics"], ranks[1]["metrics"]
    assert m0.keys() == m1.keys()
    for key in m0:
        if key != "perf/step_s":  # each rank's own wall clock
            assert m0[key] == pytest.approx(m1[key], rel=1e-12, abs=1e-12), key
    episodes = ranks[0]["episodes"] + ranks[1]["episodes"]
    assert len(episodes) == 2 * len(ranks[0]["episodes"]) == 16  # 4 questions x G=4, half on each rank
    for name in episodes[0]:
        assert m0[f"train/{name}"] == pytest.approx(sum(e[name] for e in episodes) / len(episodes)), name
    rank_means = [r["local_loss"] for r in ranks]
    assert rank_means[0] != rank_means[1]  # different shards: a rank-0-only figure would differ
    for key in rank_means[0]:
        assert m0[key] == pytest.approx((rank_means[0][key] + rank_means[1][key]) / 2), key
    assert m0["train/episodes"] == 16
    assert m0["perf/rollout_tokens_per_s"] > 0


def test_one_question_for_two_ranks_is_refused_on_every_rank(tmp_path: Path) -> None:
    ranks = _run(tmp_path, "guard")
    for r in ranks:
        assert "gspo.questions_per_step=1 must be a multiple of the world size 2" in r.get("error", ""), r
        assert "WORLD_SIZE=2" in r["error"]
