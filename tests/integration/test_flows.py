"""Flow helpers that need no Prefect server: the weekly search's best parameters reach the nightly run."""

from __future__ import annotations

from pathlib import Path

from helpers.paths import REPO_ROOT

from components.jobs import ConfigSource
from components.search import write_best_params
from flows.pipeline import with_best_params

ROOT = REPO_ROOT


def test_best_params_file_feeds_the_pipeline_under_the_users_overrides(tmp_path: Path) -> None:
    source = ConfigSource(params=str(ROOT / "params.yaml"), profile="smoke", overrides=("mas.rounds=1",))
    said: list[str] = []
    missing = tmp_path / "best.yaml"
    assert with_best_params(source, str(missing), said.append) == source
    assert said == [f"no best-parameters file at {missing} yet; training with the profile's parameters"]
    write_best_params(missing, ["mas.agents=2", "mas.rounds=2", "reward.lambda_tok=0.05"], {"trial": 3})
    cfg = with_best_params(source, str(missing), said.append).load()
    assert (cfg.mas.agents, cfg.reward.lambda_tok) == (2, 0.05)
    assert cfg.mas.rounds == 1  # the deployment's / user's own overrides still win
    assert said[-1].startswith(f"applying the search's best parameters from {missing}: mas.agents=2")
    assert with_best_params(source, None, said.append) == source


def test_the_data_subflow_gets_no_uri_password() -> None:
    """Prefect stores a subflow's parameters (the whole config) in its database and UI: a password
    in $MLFLOW_TRACKING_URI was kept there in clear."""
    import json

    from flows.pipeline import _without_secrets

    cfg = ConfigSource(params=str(ROOT / "params.yaml"), profile="smoke",
                       overrides=("tracking.uri=http://alice:S3cretPW@127.0.0.1:4398",
                                  "search.storage=postgresql+psycopg://bob:hunter2@db/optuna")).load()
    shown = json.dumps(_without_secrets(cfg).model_dump(mode="json"))
    assert "S3cretPW" not in shown and "hunter2" not in shown and "alice:***@127.0.0.1:4398" in shown
    assert _without_secrets(cfg).data == cfg.data and "S3cretPW" in cfg.tracking.uri  # the flow's own cfg intact


def test_an_artifact_that_cannot_be_posted_is_a_warning_not_a_task_failure() -> None:
    """A train task whose artifact call met a Prefect API outage was retried: the retry resumed at the
    last step (and registered the model a second time)."""
    from flows.pipeline import _post

    warned: list[str] = []

    class Logger:
        def warning(self, msg: str, *args: object) -> None:
            warned.append(msg % args)

    def down() -> None:
        raise ConnectionError("[Errno 111] Connection refused to http://u:pw@127.0.0.1:4200/api")

    _post(Logger(), "training-curves", down)
    assert len(warned) == 1 and "could not post the training-curves artifact (ConnectionError" in warned[0]
    assert "pw@" not in warned[0]


def test_an_unusable_prefect_home_is_one_line_before_the_server_starts(tmp_path: Path) -> None:
    """Was: Prefect's start timeout after ~30 s, as a RuntimeError traceback."""
    import os
    import subprocess
    import sys

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(blocker / "prefect")
    proc = subprocess.run([sys.executable, "-m", "components.cli", "run", "--profile", "smoke", "--params",
                           str(REPO_ROOT / "params.yaml")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"agent-gspo run: error: PREFECT_HOME (the temporary Prefect server keeps its database there) {blocker}" \
           in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_temporary_server_that_does_not_start_is_a_user_error(tmp_path: Path, monkeypatch) -> None:
    import pytest
    from prefect.server.api.server import SubprocessASGIServer

    from components.errors import UserError
    from flows.local_server import prefect_api

    def timeout(self) -> None:
        raise RuntimeError("Timed out while attempting to connect to ephemeral Prefect API server.")

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setattr(SubprocessASGIServer, "start", timeout)
    with pytest.raises(UserError, match="the temporary Prefect server did not start .*Set PREFECT_API_URL"):
        with prefect_api():
            pass


def test_a_dated_run_folder_takes_every_output_away_from_dvcs(tmp_path: Path) -> None:
    """The nightly deployment trained with --overwrite into runs/smoke and evaluated into eval/: the outputs
    of dvc.yaml, so `dvc status` listed them changed after every night."""
    from datetime import UTC, datetime

    import yaml
    from dvc_checks import stage_outputs

    from flows.run_folders import SCHEDULED_ROOT, dated_folder, folder_overrides

    folder = dated_folder(SCHEDULED_ROOT, "agent-gspo-pipeline", "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
                          datetime(2026, 12, 6, 2, 0, 5, tzinfo=UTC))
    assert folder == Path("runs/scheduled/agent-gspo-pipeline/20261206T020005Z-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
    source = ConfigSource(params=str(ROOT / "params.yaml"), profile="smoke", overrides=("mas.rounds=1",))
    cfg = source.plus(folder_overrides(folder, prepares_data=True)).load()
    written = [cfg.data.out_dir, cfg.data.report_dir, cfg.gspo.out_dir, cfg.eval.out_dir]
    assert all(Path(p).is_relative_to(folder) for p in written), written
    dvc_outs = stage_outputs(ROOT)
    assert not any(Path(out).is_relative_to(folder) or folder.is_relative_to(out) for out in dvc_outs)
    reads = source.plus(folder_overrides(folder, prepares_data=False)).load()
    assert reads.data.out_dir == "data" and Path(reads.eval.out_dir).is_relative_to(folder)  # search/evaluate read
    mine = source.plus(folder_overrides(folder, prepares_data=True)).plus(()).model_copy(
        update={"overrides": (*folder_overrides(folder, prepares_data=True), f"eval.out_dir={tmp_path}")}).load()
    assert mine.eval.out_dir == str(tmp_path)  # the caller's own override still wins
    for file in ("prefect.yaml", "infra/prefect-gpu.yaml"):
        for deployment in yaml.safe_load((ROOT / file).read_text())["deployments"]:
            assert deployment["parameters"]["run_root"] == SCHEDULED_ROOT, (file, deployment["name"])
