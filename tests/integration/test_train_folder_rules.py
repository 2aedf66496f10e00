"""Training never deletes checkpoints unless told to, and resumes when only tracking settings
changed (the config hash leaves ``tracking.*`` out)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.cli_forks import CliForks
from helpers.paths import REPO_ROOT
from helpers.servers import mlflow_template_db

from components.runtime.checkpoint import list_checkpoints, read_meta

pytestmark = [pytest.mark.slow, pytest.mark.integration]
ROOT = REPO_ROOT


@pytest.fixture(scope="module")
def cli():
    """Each `agent-gspo` command of this module is a fresh process forked from one that imported the
    CLI's modules once (helpers/cli_forks.py): ~40 commands, ~3 s of imports saved on each."""
    with CliForks(ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}) as forks:
        yield forks


def _empty_db(request: pytest.FixtureRequest, db: Path) -> str:
    """``sqlite:///db``, a copy of a migrated empty MLflow database (as a new server's: 4-11 s less)."""
    shutil.copy(mlflow_template_db(Path(request.config.cache.mkdir("agent-gspo-mlflow"))), db)
    return f"sqlite:///{db}"


def _sets(data_dir: Path, out: Path) -> list[str]:
    return [f"data.out_dir={data_dir}", "model.name=tiny-random", "gspo.engine=torch", "gspo.steps=4",
            "gspo.checkpoint_every=1", "gspo.keep_checkpoints=4", "gspo.questions_per_step=2", "gspo.group_size=2",
            "gspo.minibatches=2", "gspo.lr=1e-3", "mas.agents=2", "mas.rounds=1", "mas.max_message_tokens=8",
            f"tracking.uri=sqlite:///{out.parent / 'first.db'}"]


def _run(cli: CliForks, data_dir: Path, out: Path, *extra: str, env: dict[str, str] | None = None):
    """`agent-gspo train --no-track` into ``out``; with ``env={"POPEN": "1"}`` started, not waited for."""
    sets = _sets(data_dir, out)
    args = ["train", "--no-track", "--out", str(out), *[a for s in sets for a in ("--set", s)], *extra]
    if env is not None and env.get("POPEN"):  # started in the background
        return cli.start(*args, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return cli.run(*args, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, timeout=600)


def _snapshot(out: Path) -> list[tuple[str, float]]:
    return [(c.name, read_meta(c).created) for c in list_checkpoints(out)]


def test_used_folder_needs_resume_or_overwrite(cli: CliForks, prepared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = _run(cli, prepared_data, out, "--max-steps", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    before = _snapshot(out)
    assert [name for name, _ in before] == ["step-000001", "step-000002"]

    again = _run(cli, prepared_data, out)
    assert again.returncode == 2, again.stderr[-3000:]
    assert "--resume" in again.stderr and "--overwrite" in again.stderr and "step-000002" in again.stderr
    assert _snapshot(out) == before  # nothing deleted

    both = _run(cli, prepared_data, out, "--resume", "--overwrite")
    assert both.returncode == 2 and "exclude each other" in both.stderr
    assert _snapshot(out) == before

    # only tracking settings differ (another URI through the environment, another experiment): resumes
    moved = _run(cli, prepared_data, out, "--resume", "--set", "tracking.experiment=elsewhere",
                 env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'second.db'}"})
    assert moved.returncode == 0, moved.stderr[-3000:]
    assert f"resumed from {out / 'checkpoints' / 'step-000002'}" in moved.stderr
    assert [name for name, _ in _snapshot(out)] == [f"step-00000{i}" for i in range(1, 5)]
    assert _snapshot(out)[:2] == before  # the earlier checkpoints were kept

    fresh = _run(cli, prepared_data, out, "--overwrite")
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert "resumed from" not in fresh.stderr
    after = _snapshot(out)
    assert [name for name, _ in after] == [f"step-00000{i}" for i in range(1, 5)]
    assert after[0][1] > before[0][1]  # started over: step 1 was written again
    assert len(json.loads((out / "history.json").read_text())) == 4

    # an earlier run's outputs without its checkpoints: refused, then --overwrite deletes them before
    # step 1, so a run that dies part-way cannot leave the old final policy next to its checkpoints
    shutil.rmtree(out / "checkpoints")
    left = _run(cli, prepared_data, out, "--max-steps", "1")
    assert left.returncode == 2 and "outputs of an earlier run (final, metrics.json, history.json, plots)" \
        in left.stderr and "--overwrite" in left.stderr, left.stderr[-2000:]
    assert (out / "final").is_dir() and not (out / "checkpoints").exists()
    from components.config import load_config
    from components.runtime.training_run import train

    def dies_after_step(step: int, metrics: dict) -> None:
        raise RuntimeError("injected: the run dies after step 1")

    cfg = load_config(ROOT / "params.yaml", overrides=_sets(prepared_data, out))
    with pytest.raises(RuntimeError, match="injected"):
        train(cfg, overwrite=True, out_dir=out, track=False, on_step=dies_after_step)
    assert not any((out / name).exists() for name in ("final", "metrics.json", "history.json", "plots"))
    assert list_checkpoints(out) == []  # it died in step 1, before its first checkpoint


def test_damaged_checkpoints_and_unusable_folders_fail_by_name(cli: CliForks, prepared_data: Path,
                                                               tmp_path: Path) -> None:
    """A corrupt checkpoint file, a changed setting, step folders without meta.json and an --out that
    is a file: each one message naming it, exit 2, and no checkpoint replaced."""
    out = tmp_path / "run"
    assert _run(cli, prepared_data, out, "--max-steps", "2").returncode == 0
    before = _snapshot(out)

    changed = _run(cli, prepared_data, out, "--resume", "--set", "gspo.lr=2e-3")
    assert changed.returncode == 2 and "gspo.lr 0.001 -> 0.002" in changed.stderr, changed.stderr[-2000:]

    for damaged in ("model/model.safetensors", "engine/engine_state.pt", "rng/rank-00000.pt", "extra.json",
                    "meta.json"):
        copy = tmp_path / f"copy-{damaged.replace('/', '-')}"
        shutil.copytree(out, copy)
        target = copy / "checkpoints" / "step-000002" / damaged
        target.write_bytes(target.read_bytes()[: max(1, target.stat().st_size // 2)])
        res = _run(cli, prepared_data, copy, "--resume")
        lines = [line for line in res.stderr.splitlines() if line.startswith("agent-gspo train: error:")]
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
        # a hashed file fails its sha256 (meta.json's list) before it is parsed; meta.json itself fails to parse
        assert str(target) in lines[0] and ("corrupt or unreadable checkpoint file" in lines[0]
                                            or "content changed since the checkpoint was written" in lines[0]), lines
    assert _snapshot(out) == before

    # files that parse but hold the wrong contents: the same one error naming them, never a traceback
    import torch

    from components.runtime.checkpoint_integrity import hash_files

    step2 = Path("checkpoints") / "step-000002"
    meta = json.loads((out / step2 / "meta.json").read_text())
    for name, part, write in (
            ("empty-extra", "extra.json", lambda f: f.write_text("{}")),
            ("no-hash", "extra.json", lambda f: f.write_text(json.dumps(
                {k: v for k, v in json.loads(f.read_text()).items() if k != "config_hash"}))),
            ("empty-optimizer", "engine/engine_state.pt", lambda f: torch.save({}, f)),
            ("empty-rng", "rng/rank-00000.pt", lambda f: torch.save({}, f)),
            ("meta-step", "meta.json", lambda f: f.write_text(json.dumps(meta | {"step": 99})))):
        copy = tmp_path / f"contents-{name}"
        shutil.copytree(out, copy)
        write(copy / step2 / part)
        if part != "meta.json":  # hashes rewritten to match: the content checks behind the sha256 list still hold
            rewritten = json.loads((copy / step2 / "meta.json").read_text())
            rewritten["files"] = hash_files(copy / step2)
            (copy / step2 / "meta.json").write_text(json.dumps(rewritten))
        res = _run(cli, prepared_data, copy, "--resume")
        lines = [line for line in res.stderr.splitlines() if line.startswith("agent-gspo train: error:")]
        assert res.returncode == 2 and "Traceback" not in res.stderr and "resumed from" not in res.stderr, \
            res.stderr[-3000:]
        assert lines[0].startswith(f"agent-gspo train: error: {copy / step2 / part}: corrupt or incompatible "
                                   "checkpoint ("), lines

    # settings that cannot change the trained weights may change on --resume (fewer checkpoints kept
    # after a full disk, a moved run folder, evaluation and registry settings)
    free = tmp_path / "free-settings"
    shutil.copytree(out, free)
    res = _run(cli, prepared_data, free, "--resume", "--max-steps", "3", "--set", "gspo.keep_checkpoints=1",
               "--set", "gspo.checkpoint_every=3", "--set", "gspo.out_dir=elsewhere", "--set", "eval.limit=3",
               "--set", "registry.model_name=other", "--set", "search.trials=3")
    assert res.returncode == 0 and "resumed from" in res.stderr, res.stderr[-3000:]
    assert [p.name for p in list_checkpoints(free)] == ["step-000003"]

    no_meta = tmp_path / "no-meta"
    shutil.copytree(out, no_meta)
    for meta in (no_meta / "checkpoints").glob("step-*/meta.json"):
        meta.unlink()
    for extra in ((), ("--resume",)):
        res = _run(cli, prepared_data, no_meta, *extra)
        assert res.returncode == 2 and "without meta.json" in res.stderr and "--overwrite" in res.stderr, res.stderr
    assert sorted(p.name for p in (no_meta / "checkpoints").iterdir()) == ["step-000001", "step-000002"]

    newer_damaged = tmp_path / "newer-damaged"  # step 2 damaged, step 1 complete: --resume must not redo step 2
    shutil.copytree(out, newer_damaged)
    (newer_damaged / "checkpoints" / "step-000002" / "meta.json").unlink()
    res = _run(cli, prepared_data, newer_damaged, "--resume")
    assert res.returncode == 2 and "newer than the last complete one (step-000001)" in res.stderr, res.stderr[-2000:]

    a_file = tmp_path / "a-file"
    a_file.write_text("")
    res = _run(cli, prepared_data, a_file)
    assert res.returncode == 2 and f"{a_file}: exists and is not a folder" in res.stderr, res.stderr[-2000:]
    assert "Loading" not in res.stderr  # refused before the model loads
    for name in ("checkpoints", "final"):  # not after a whole training step, with a traceback
        holder = tmp_path / f"{name}-a-file"
        holder.mkdir()
        (holder / name).write_text("x")
        for extra in ((), ("--resume",), ("--overwrite",)):
            res = _run(cli, prepared_data, holder, "--max-steps", "1", *extra)
            assert res.returncode == 2 and f"{holder / name}: exists and is not a folder" in res.stderr, res.stderr
            assert "Loading" not in res.stderr and "Traceback" not in res.stderr
        assert (holder / name).read_text() == "x"

    empty = _run(cli, prepared_data, tmp_path / "new", "--resume", "--max-steps", "1")
    assert empty.returncode == 0 and "no checkpoint in" in empty.stderr and "starting from step 1" in empty.stderr


def test_one_training_per_folder_and_sigterm_ends_it_cleanly(cli: CliForks, prepared_data: Path,
                                                             tmp_path: Path) -> None:
    """A second run into a folder another run holds is refused before anything loads; SIGTERM ends a
    run with one line and exit 143, and --resume then continues from its checkpoints."""
    import signal
    import time

    import filelock

    out = tmp_path / "run"
    out.mkdir()
    with filelock.FileLock(str(out / ".train.lock")):  # another training in progress
        for extra in ((), ("--resume",), ("--overwrite",)):
            res = _run(cli, prepared_data, out, *extra)
            assert res.returncode == 2 and "another training is running in this folder" in res.stderr, res.stderr
    long = ("--set", "gspo.steps=400")
    proc = _run(cli, prepared_data, out, *long, env={"POPEN": "1"})
    deadline = time.monotonic() + 300
    while not list_checkpoints(out) and time.monotonic() < deadline:
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    ended = proc.wait(timeout=120)
    err = ended.stderr
    assert ended.returncode == 143, err[-3000:]
    assert "Traceback" not in err and "agent-gspo train: interrupted (SIGTERM)" in err, err[-3000:]
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".tmp-")]
    newest = int(list_checkpoints(out)[-1].name.removeprefix("step-"))
    resumed = _run(cli, prepared_data, out, *long, "--resume", "--max-steps", str(newest + 1))
    assert resumed.returncode == 0 and "resumed from" in resumed.stderr, resumed.stderr[-3000:]


def test_a_resume_at_the_last_step_does_not_register_the_model_again(
        cli: CliForks, prepared_data: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A flow retry after a failure *after* training (an artifact call to a Prefect server that went down)
    resumed at the last step and registered the same policy as a second version of the same run."""
    from mlflow import MlflowClient

    out, db = tmp_path / "run", tmp_path / "reg.db"
    track = ["--set", f"tracking.uri={_empty_db(request, db)}", "--set", "registry.model_name=resume-once",
             "--set", "gspo.steps=2"]
    first = cli.run("train", "--out", str(out), *[a for s in _sets(prepared_data, out)[:-1] for a in ("--set", s)],
                    *track, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert first.returncode == 0 and "registered resume-once version 1" in first.stderr, first.stderr[-3000:]
    again = cli.run("train", "--out", str(out), "--resume",
                    *[a for s in _sets(prepared_data, out)[:-1] for a in ("--set", s)], *track,
                    env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert again.returncode == 0 and "was registered by this run already" in again.stderr, again.stderr[-3000:]
    versions = MlflowClient(f"sqlite:///{db}").search_model_versions("name='resume-once'")
    assert [str(v.version) for v in versions] == ["1"]
    assert json.loads((out / "final" / "registered_model.json").read_text())["version"] == "1"


def test_a_tracked_run_resumes_after_its_tracking_server_moved(cli: CliForks, prepared_data: Path, tmp_path: Path,
                                                               request: pytest.FixtureRequest) -> None:
    """The checkpoint's MLflow run is not on the new server: the run goes on in a new run there, tagged
    with the old id, with one warning naming both (the earlier steps' metrics stay on the old server)."""
    from mlflow import MlflowClient

    out = tmp_path / "run"

    def tracked(uri: str, *extra: str) -> subprocess.CompletedProcess:
        sets = [s for s in _sets(prepared_data, out) if not s.startswith("tracking.uri=")] + ["gspo.steps=3"]
        return cli.run("train", "--params", str(ROOT / "params.yaml"), "--out", str(out),
                       *[a for s in sets for a in ("--set", s)], *extra, cwd=tmp_path,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": uri},
                       timeout=600)

    first_uri, second_uri = (_empty_db(request, tmp_path / name) for name in ("first.db", "second.db"))
    first = tracked(first_uri, "--max-steps", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    (old_run,) = MlflowClient(first_uri).search_runs([MlflowClient(first_uri).get_experiment_by_name(
        "agent-gspo").experiment_id])
    old = old_run.info.run_id
    moved = tracked(second_uri, "--resume")
    assert moved.returncode == 0, moved.stderr[-3000:]
    warnings = [line for line in moved.stderr.splitlines() if line.startswith("warning: MLflow run")]
    assert len(warnings) == 1 and old in warnings[0] and "earlier steps stay" in warnings[0], moved.stderr[-3000:]
    client = MlflowClient(second_uri)
    (new_run,) = client.search_runs([client.get_experiment_by_name("agent-gspo").experiment_id])
    assert f"new run {new_run.info.run_id}" in warnings[0]
    assert new_run.info.status == "FINISHED" and new_run.data.tags["agent_gspo.resumed_from_run"] == old
    assert new_run.data.params  # a new run gets the config as params, like any first run
    assert [m.step for m in client.get_metric_history(new_run.info.run_id, "train/reward")][-1] == 3
    assert "step 3/3" in moved.stdout and (out / "final" / "model.safetensors").is_file()
