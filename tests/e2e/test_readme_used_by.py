"""The README's used-by block (registry promotion on a fresh registry) runs as written, in order.

Was: the README evaluated ``models:/agent-gspo-policy@champion`` right after the first ``train``,
which exits 2 on a fresh registry (no alias yet); the order that works was only in an error message.
This test reads the block between ``<!-- used-by:begin -->`` and ``<!-- used-by:end -->`` and runs
every ``agent-gspo`` line of it, in order, each step's exit code checked.

Substituted, and nothing else (every option the README gives is passed as written):

* ``agent-gspo`` -> ``python -m components.cli`` from this checkout (the installed script may point
  at another checkout);
* ``--set model.name=tiny-random`` appended to every command (seconds instead of SmolLM2's minutes);
* paths, through the environment, not the command line: the commands run in a temporary folder
  (so ``data/``, ``runs/smoke``, ``eval/`` and ``mlruns/`` land there), with
  ``AGENT_GSPO_PARAMS`` = this checkout's ``params.yaml``, ``AGENT_GSPO_DATA_MIRROR`` = the
  benchmark mirror, ``MLFLOW_TRACKING_URI`` = a fresh sqlite registry in that folder (a copy of
  an empty, migrated database: what MLflow creates on first use, without its ~20 s of migrations)
  and ``AGENT_GSPO_MODEL_CACHE`` in that folder.

Which decision ``promote`` takes is not checked (the gate's rule may keep the champion on a tiny
evaluation), only that it exits 0 and prints its decision block for the candidate it was given.
About 2 minutes on 2 CPU cores. The order itself is also checked without running anything:
``tests/unit/test_docs.py``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT
from helpers.readme import used_by_commands
from helpers.servers import mlflow_template_db

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ROOT = REPO_ROOT
MIRROR = Path(os.environ.get("AGENT_GSPO_DATA_MIRROR", ROOT.parent / "shared" / "benchmarks"))
TINY = ["--set", "model.name=tiny-random"]


def test_readme_used_by_block_runs_in_order_on_a_fresh_registry(tmp_path: Path, request) -> None:
    if not (MIRROR / "gsm8k").is_dir():
        pytest.skip(f"benchmark mirror not found at {MIRROR} (set AGENT_GSPO_DATA_MIRROR)")
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    template = mlflow_template_db(Path(cache.mkdir("agent-gspo-mlflow")) if cache else tmp_path / "template")
    db = tmp_path / "mlflow.db"
    shutil.copy(template, db)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AGENT_GSPO_PARAMS": str(ROOT / "params.yaml"),
           "AGENT_GSPO_DATA_MIRROR": str(MIRROR), "MLFLOW_TRACKING_URI": f"sqlite:///{db}",
           "AGENT_GSPO_MODEL_CACHE": str(tmp_path / "model-cache"), "OMP_NUM_THREADS": "1"}
    env.pop("PREFECT_API_URL", None)
    for cmd in used_by_commands((ROOT / "README.md").read_text()):
        res = subprocess.run([sys.executable, "-m", "components.cli", *cmd[1:], *TINY], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=600)
        shown = " ".join(cmd)
        assert res.returncode == 0, f"{shown}: exit {res.returncode}\n{res.stderr[-3000:]}"
        if cmd[1] == "promote":
            version = cmd[cmd.index("--candidate") + 1].rsplit("/", 1)[1]
            refused = re.search(rf"^agent-gspo-policy v{version}: refused - ", res.stdout, re.M)  # one line
            block = (re.search(rf"^agent-gspo-policy v{version} under setting ", res.stdout, re.M)
                     and re.search(r"^  decision: (champion|challenger|rejected|unchanged) - ", res.stdout, re.M))
            assert refused or block, f"{shown}: no decision printed\n{res.stdout[-2000:]}"
