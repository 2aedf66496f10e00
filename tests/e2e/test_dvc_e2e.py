"""DVC as its users type it, on a fresh copy of the repository with a tiny smoke profile.

The copy (the repository's tracked and new files, its own git history) sits next to a
``shared/benchmarks`` link, as a clone sits next to the mirror. Its smoke profile uses the tiny
random model and one training step, so the whole chain takes about a minute. Checked: ``dvc
repro`` runs the four smoke stages only and a second call is a no-op; after the report stages
``dvc status`` is clean (every declared stage locked); the lock check passes on
the committed lock and fails after a code change; ``dvc exp run -S`` with ``--temp`` and
``--queue`` (one of them re-preparing the data, which needs the mirror from the temporary copy);
``dvc exp show`` and ``dvc metrics diff`` compare numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from dvc_checks import stale_lock
from helpers.paths import REPO_ROOT
from helpers.repo_copy import copy_checkout

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ROOT = REPO_ROOT
MIRROR = Path(os.environ.get("AGENT_GSPO_DATA_MIRROR", ROOT.parent / "shared" / "benchmarks"))
TINY_SMOKE = {"model": {"name": "tiny-random"}, "gspo": {"steps": 1}, "mas": {"max_message_tokens": 4},
              "eval": {"limit": 1, "baselines": [], "benchmarks": ["gsm8k", "aqua"]}}


def _copy_repo(dest: Path) -> Path:
    copy_checkout(dest)
    for stale in ("dvc.lock", "experiments/dvc.lock"):
        (dest / stale).unlink(missing_ok=True)
    params = yaml.safe_load((dest / "params.yaml").read_text())
    for section, values in TINY_SMOKE.items():
        params["profiles"]["smoke"].setdefault(section, {}).update(values)
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return dest


def _run(repo: Path, *cmd: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "AGENT_GSPO_DATA_MIRROR"} | {
        "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    res = subprocess.run(list(cmd), cwd=repo, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{cmd}: {res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def _ran(res: subprocess.CompletedProcess) -> list[str]:
    text = res.stdout + res.stderr
    return [line.split("'")[1] for line in text.splitlines() if line.startswith("Running stage '")]


def _exp_metrics(show: list, name: str) -> dict:
    for baseline in show:
        for exp in baseline.get("experiments") or []:
            rev = exp["revs"][0]
            if rev.get("name") == name:
                return rev["data"]["metrics"]
    raise AssertionError(f"experiment {name} not in dvc exp show")


def test_repro_exp_run_temp_queue_show_and_metrics_diff(tmp_path: Path) -> None:
    if not (MIRROR / "gsm8k").is_dir():
        pytest.skip(f"benchmark mirror not found at {MIRROR}")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "benchmarks").symlink_to(MIRROR.resolve())
    repo = _copy_repo(tmp_path / "repo")
    _run(repo, "git", "init", "-q")
    _run(repo, "git", "add", "-A")
    _run(repo, "git", "commit", "-qm", "fresh clone")

    first = _run(repo, "dvc", "repro")
    assert _ran(first) == ["prepare", "validate", "train", "evaluate"]  # the smoke chain, never the experiments
    again = _run(repo, "dvc", "repro")
    assert _ran(again) == [] and "Data and pipelines are up to date" in again.stdout
    for name in ("data.json", "train.json", "eval/agent_gspo.json"):  # eval: one file per system (no baselines here)
        assert json.loads((repo / "metrics" / name).read_text())
    _run(repo, "dvc", "repro", "-s", "experiments/dvc.yaml:report")  # the report alone, from results/*.json
    _run(repo, "dvc", "repro", "-s", "experiments/dvc.yaml:report_cap128")  # and the cap-128 set's
    _run(repo, "dvc", "repro", "-s", "experiments/dvc.yaml:report_proof_v2")  # and the splitinfo2 proof's
    _run(repo, "dvc", "repro", "-s", "experiments/dvc.yaml:report_devchoice1")  # and the dev-chosen recipe's
    _run(repo, "git", "add", "-A")
    _run(repo, "git", "commit", "-qm", "lock")
    assert stale_lock(repo) == []
    # every stage of both pipelines locked and up to date: the experiment runs were stages that `dvc repro`
    # never ran, so `dvc status` listed them (and every dependency) as changed forever
    assert json.loads(_run(repo, "dvc", "status", "--json").stdout) == {}
    loss = repo / "components" / "gspo" / "loss.py"
    loss.write_text(loss.read_text() + "\n# a change the lock has not seen\n")
    assert "train: components/gspo modified" in stale_lock(repo)
    _run(repo, "git", "checkout", "--", "components/gspo/loss.py")

    temp = _run(repo, "dvc", "exp", "run", "--temp", "-n", "b60", "-S", "profiles.smoke.budget.target=60")
    assert _ran(temp) == ["train", "evaluate"]
    _run(repo, "dvc", "exp", "run", "--queue", "-n", "norm50", "-S", "profiles.smoke.reward.token_norm=50")
    _run(repo, "dvc", "exp", "run", "--queue", "-n", "nohub", "-S", "data.use_hub=false")  # re-prepares the data
    queued = _run(repo, "dvc", "exp", "run", "--run-all")
    assert "prepare" in _ran(queued)
    _run(repo, "dvc", "queue", "stop")
    show = json.loads(_run(repo, "dvc", "exp", "show", "--json").stdout)
    b60 = _exp_metrics(show, "b60")
    assert b60["metrics/train.json"]["data"]["budget"] == 60.0
    assert isinstance(b60["metrics/eval/agent_gspo.json"]["data"]["tokens"], float)
    assert _exp_metrics(show, "nohub")["metrics/data.json"]["data"]["n"] == 29722  # 7 benchmarks + splitinfo
    assert _exp_metrics(show, "norm50")["metrics/train.json"]["data"]["n"] == 1  # steps: gspo.steps is 1 here

    _run(repo, "dvc", "exp", "apply", "b60")
    diff = json.loads(_run(repo, "dvc", "metrics", "diff", "--json").stdout)
    assert diff["metrics/train.json"]["budget"] == {"old": 120.0, "new": 60.0, "diff": -60.0}
