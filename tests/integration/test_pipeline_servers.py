"""The whole pipeline against real servers on 127.0.0.1: ``prefect server start`` + ``mlflow server``.

A. ``pipeline_flow`` end to end (tiny random model, tiny sizes); assertions go through the MLflow
   and Prefect APIs: runs, per-step metrics, registry tags + @champion, flow / task runs, artifacts.
B. The ``evaluate`` deployment of prefect.yaml (``prefect deploy -n evaluate``), a flow run
   scheduled in the past, picked up and COMPLETED by ``prefect worker start --run-once``.
C. Faults: the MLflow server dies during training and stays down past its end (training goes on,
   no checkpoint is lost, the buffered metrics and the model reach the same run after a restart);
   the training subprocess is SIGKILLed inside a Prefect task (the retry resumes, final weights
   equal an uninterrupted run). Both plant a password in URI settings and grep every output,
   param, tag, file and Prefect log for it.

Every flow / training process runs with ``cwd`` = the repo root (as a Prefect worker with
``AGENT_GSPO_HOME`` does, so ``git.commit`` resolves) but every output path is an override into
``tmp_path``: nothing is written into the repo's data/, runs/, eval/, reports/.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from helpers.leaks import assert_secrets_absent
from helpers.paths import REPO_ROOT
from helpers.servers import (
    MlflowServer,
    PrefectServer,
    mlflow_server,
    mlflow_template_db,
    prefect_server,
    run_worker_once,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = REPO_ROOT
MIRROR = Path(os.environ.get("AGENT_GSPO_DATA_MIRROR", ROOT.parent / "shared" / "benchmarks"))
PARAMS = str(ROOT / "params.yaml")
BENCHES = ["gsm8k", "aqua"]
TINY = ["model.name=tiny-random", "gspo.engine=torch", "gspo.steps=2", "gspo.questions_per_step=2",
        "gspo.group_size=2", "gspo.minibatches=2", "gspo.checkpoint_every=1", "gspo.keep_checkpoints=2",
        "gspo.lr=1e-3", "mas.agents=2", "mas.rounds=1", "mas.max_message_tokens=8", "eval.limit=1",
        "eval.benchmarks=[gsm8k,aqua]", "eval.baselines=[single_cot]", "data.benchmarks=[gsm8k,aqua]",
        "registry.min_accuracy=0", "registry.gate.min_items=2"]


TEAM_KEY = secrets.token_hex(32)
"""the evaluators' shared signing key: against a tracking server, not a key generated in the user's ~/.config"""


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    base = {**os.environ, "PYTHONPATH": str(ROOT), "AGENT_GSPO_DATA_MIRROR": str(MIRROR), "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1", "AGENT_GSPO_SIGNING_KEY": TEAM_KEY}
    return {**base, **(extra or {})}


def _paths(tmp: Path, data_dir: Path | None = None) -> list[str]:
    return [f"data.out_dir={data_dir or tmp / 'prepared'}", f"data.report_dir={tmp / 'reports'}",
            f"gspo.out_dir={tmp / 'run'}", f"eval.out_dir={tmp / 'eval'}"]


def _sqlite_uri(tmp: Path, cache: Path) -> str:
    db = tmp / "mlflow.db"
    shutil.copy(mlflow_template_db(cache), db)
    return f"sqlite:///{db}"


def _cache_dir(request: pytest.FixtureRequest) -> Path:
    """pytest's cache folder for the migrated MLflow template DB (a tmp folder when the cache is off)."""
    cache = getattr(request.config, "cache", None)
    if cache is not None:
        return Path(cache.mkdir("agent-gspo-mlflow"))
    return request.getfixturevalue("tmp_path_factory").mktemp("mlflow-template")


def _run_python(code: str, args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _marker(text: str, key: str) -> str:
    """The value printed as ``KEY value`` by a driver script."""
    for line in text.splitlines():
        if line.startswith(key + " "):
            return line[len(key) + 1:]
    raise AssertionError(f"{key} not printed:\n{text[-4000:]}")


def _client(api_url: str):
    from prefect.client.orchestration import SyncPrefectClient

    return SyncPrefectClient(api_url)


def _flow_tree(client, flow_run_id: str) -> list:
    """The flow run and its subflow runs (e.g. data-prep inside the pipeline)."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    subs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
        parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])))
    return [client.read_flow_run(flow_run_id), *[r for r in subs if str(r.id) != flow_run_id]]


def _task_runs(client, flow_run_ids: list) -> list:
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterFlowRunId

    return client.read_task_runs(task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=flow_run_ids)))


@pytest.fixture(scope="module")
def prefect(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    """One Prefect server for the module (a fresh one per test costs ~10 s each on 2 cores)."""
    if not (MIRROR / "gsm8k").is_dir():
        pytest.skip(f"benchmark mirror not found at {MIRROR}")
    with prefect_server(tmp_path_factory.mktemp("prefect")) as server:
        yield server


@pytest.fixture()
def mlflow_srv(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[MlflowServer]:
    """A fresh MLflow server per test: a fresh registry (first model = champion), stoppable alone."""
    with mlflow_server(tmp_path, _cache_dir(request)) as server:
        yield server


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gsm8k + aqua prepared once without Prefect (for tests whose subject is not data prep)."""
    from components.data.prepare import prepare

    if not (MIRROR / "gsm8k").is_dir():
        pytest.skip(f"benchmark mirror not found at {MIRROR}")
    out = tmp_path_factory.mktemp("data")
    prepare(BENCHES, mirror=MIRROR, out_dir=out, progress=False)
    return out


PIPELINE = """
import json, sys
from flows.pipeline import pipeline_flow
state = pipeline_flow(params=sys.argv[1], overrides=json.loads(sys.argv[2]), return_state=True)
print("FLOW_RUN", state.state_details.flow_run_id, flush=True)
print("RESULT", json.dumps(state.result(), default=str), flush=True)
"""


def test_pipeline_end_to_end(prefect: PrefectServer, mlflow_srv: MlflowServer, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from components.tracking import git_commit

    overrides = [*TINY, *_paths(tmp_path), f"tracking.uri={mlflow_srv.url}"]
    t0 = time.monotonic()
    res = _run_python(PIPELINE, [PARAMS, json.dumps(overrides)], _env(prefect.client_env()), timeout=420)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-6000:]
    print(f"pipeline_flow: {time.monotonic() - t0:.1f} s")
    result = json.loads(_marker(res.stdout, "RESULT"))
    flow_run_id = _marker(res.stdout, "FLOW_RUN")

    # data prep honoured the benchmark subset and the output folders of the overrides
    prepared = tmp_path / "prepared"
    assert sorted(p.name for p in prepared.iterdir() if p.is_dir()) == sorted(BENCHES)
    assert sorted(json.loads((prepared / "manifest.json").read_text())["benchmarks"]) == sorted(BENCHES)
    assert (tmp_path / "reports" / "validation.md").is_file()

    # MLflow, through the server's API
    client = MlflowClient(mlflow_srv.url)
    exp = client.get_experiment_by_name("agent-gspo")
    runs = client.search_runs([exp.experiment_id])
    train = [r for r in runs if r.data.tags.get("stage") == "train"]
    assert len(train) == 1 and train[0].info.status == "FINISHED"
    train_metrics = [k for k in train[0].data.metrics if k.startswith("train/")]
    assert {"train/reward", "train/accuracy", "train/tokens_total", "train/lambda_tok"} <= set(train_metrics)
    for key in train_metrics:
        steps = sorted(m.step for m in client.get_metric_history(train[0].info.run_id, key))
        assert steps == [1, 2], (key, steps)
    evals = [r for r in runs if r.data.tags.get("stage") == "evaluate"]
    assert evals and all(r.info.status == "FINISHED" for r in evals)
    for bench in BENCHES:
        assert any(f"eval/{bench}/accuracy" in r.data.metrics for r in evals), bench
    version = client.get_model_version_by_alias("agent-gspo-policy", "champion")
    assert result["model"] == f"models:/agent-gspo-policy/{version.version}"
    assert result["promotion"]["decision"] == "champion"
    tags = version.tags
    key = result["promotion"]["setting"]
    assert {"config.sha256", "git.commit", "data.manifest_sha256", f"eval.{key}.accuracy"} <= set(tags)
    (linked,) = [r for r in evals if r.info.run_id == tags[f"eval.{key}.run_id"]]  # run <-> version
    assert linked.data.tags["eval.model_version"] == str(version.version)
    assert linked.data.params["setting.key"] == key and linked.data.metrics["eval/accuracy"] == pytest.approx(
        result["summary"]["agent_gspo"]["accuracy"])
    assert tags["config.sha256"] == train[0].data.tags["config.sha256"]
    sha = tags["git.commit"]  # a commit of this repo (HEAD may move while the test runs: compare loosely)
    assert git_commit(ROOT) is None or subprocess.run(["git", "cat-file", "-e", f"{sha}^{{commit}}"], cwd=ROOT,
                                                      timeout=30).returncode == 0, sha
    assert tags["data.manifest_sha256"] != "missing"
    assert float(tags[f"eval.{key}.accuracy"]) == pytest.approx(result["summary"]["agent_gspo"]["accuracy"])

    # Prefect, through the server's API
    with _client(prefect.api_url) as pc:
        flows = _flow_tree(pc, flow_run_id)
        assert all(f.state_type.value == "COMPLETED" for f in flows), [(f.name, f.state_type) for f in flows]
        assert len(flows) == 2  # the pipeline + its data-prep subflow
        tasks = _task_runs(pc, [f.id for f in flows])
        names = [t.name.rsplit("-", 1)[0] for t in tasks]  # task run names are "<task>-<3 hex>"
        for expected in ("train", "evaluate", "promote", "write-manifest", "validate-data"):
            assert expected in names, names
        assert names.count("prepare-benchmark") == len(BENCHES)
        assert all(t.state_type.value == "COMPLETED" for t in tasks), [(t.name, t.state_type) for t in tasks]
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

        arts = pc.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(
            any_=[f.id for f in flows])))
        from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

        log_filter = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[f.id for f in flows]))
        logs: list[str] = []
        while page := pc.read_logs(log_filter=log_filter, limit=200, offset=len(logs)):  # the API's page limit
            logs += [entry.message for entry in page]
    # progress reaches the Prefect logs: training steps, evaluation batches with counts, the gate's setting
    assert any(m.startswith("step 2/2") for m in logs), logs[-50:]
    assert any(m.startswith("evaluate agent_gspo (pooled): 2 items in 1 batch") for m in logs), logs[-50:]
    assert any(m.startswith("promote models:/agent-gspo-policy/") for m in logs), logs[-50:]
    keys = {a.key for a in arts}
    assert {"data-validation", "training-curves", "evaluation", "promotion"} <= keys, keys


DATA_PREP = """
import json, sys
from flows.data_prep import data_prep_flow
for out in sys.argv[3:]:
    state = data_prep_flow(params=sys.argv[1], benchmarks=["aqua"], out_dir=out, overrides=json.loads(sys.argv[2]),
                           return_state=True)
    state.result()
    print("FLOW_RUN", state.state_details.flow_run_id, flush=True)
"""


def test_data_prep_cache_is_per_output_folder(prefect: PrefectServer, tmp_path: Path) -> None:
    """first, second, first: each empty folder is prepared (the output folder is part of the cache key) and
    an unchanged folder is a cache hit; then a deleted output refreshes the cache (prepared again), after
    which the folder is a hit again."""
    first, second = tmp_path / "first", tmp_path / "second"
    overrides = json.dumps([f"data.report_dir={tmp_path / 'reports'}"])

    def run(*folders: Path) -> list[list[str]]:
        res = _run_python(DATA_PREP, [PARAMS, overrides, *map(str, folders)], _env(prefect.client_env()), timeout=300)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
        runs = [line.split()[1] for line in res.stdout.splitlines() if line.startswith("FLOW_RUN ")]
        with _client(prefect.api_url) as pc:
            return [[t.state_name for t in _task_runs(pc, [r]) if t.name.startswith("prepare-benchmark")]
                    for r in runs]

    assert run(first, second, first) == [["Completed"], ["Completed"], ["Cached"]]
    for folder in (first, second):
        assert sorted(p.name for p in (folder / "aqua").glob("*.parquet")) == ["dev.parquet", "test.parquet"]
    (first / "aqua" / "test.parquet").unlink()
    assert run(first, first) == [["Completed"], ["Cached"]]
    assert (first / "aqua" / "test.parquet").is_file()


DATA_PREP_FAILS = """
import json, sys
from flows.data_prep import data_prep_flow
from components.data.spec import DataValidationError
for mirror in sys.argv[3:]:
    try:
        data_prep_flow(params=sys.argv[1], benchmarks=["humaneval", "multiarith"], mirror=mirror,
                       overrides=json.loads(sys.argv[2]))
    except DataValidationError as exc:
        print("REFUSED", str(exc).splitlines()[0], flush=True)
"""


def _synthetic_mirror(root: Path, multiarith_rows: int, humaneval_rows: int) -> Path:
    import gzip

    (root / "multiarith").mkdir(parents=True)
    (root / "multiarith/MultiArith.json").write_text(json.dumps(
        [{"iIndex": i, "sQuestion": f"Tom has {i} apples. How many?", "lEquations": [f"X={i}"],
          "lSolutions": [float(i)], "lAlignments": []} for i in range(multiarith_rows)]))
    (root / "humaneval").mkdir()
    with gzip.open(root / "humaneval/HumanEval.jsonl.gz", "wt") as fh:
        fh.writelines(json.dumps({"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n    \"\"\"Return x.\"\"\"\n",
                                  "canonical_solution": "    return x\n", "entry_point": f"f{i}",
                                  "test": "def check(candidate):\n    assert candidate(1) == 1\n"}) + "\n"
                      for i in range(humaneval_rows))
    return root


def test_data_prep_flow_writes_nothing_unless_every_benchmark_passes(prefect: PrefectServer, tmp_path: Path) -> None:
    """As `agent-gspo prepare`: a valid HumanEval is not written next to a failing MultiArith, and two
    failing benchmarks give one report with both (tasks writing their own overwrote each other's)."""
    out, reports = tmp_path / "data", tmp_path / "reports"
    one_bad = _synthetic_mirror(tmp_path / "one-bad", 599, 164)
    both_bad = _synthetic_mirror(tmp_path / "both-bad", 599, 163)
    overrides = json.dumps([f"data.out_dir={out}", f"data.report_dir={reports}", "data.use_hub=false"])
    res = _run_python(DATA_PREP_FAILS, [PARAMS, overrides, str(one_bad)], _env(prefect.client_env()), timeout=300)
    refused = [line for line in res.stdout.splitlines() if line.startswith("REFUSED")]
    assert refused and "multiarith: great-expectations validation failed" in refused[0], res.stderr[-4000:]
    assert "nothing was written" in refused[0]
    assert not (out / "humaneval").exists() and not (out / "manifest.json").exists()
    assert "| humaneval | test | 164 | 164 | ok |" in (reports / "validation.md").read_text()

    res = _run_python(DATA_PREP_FAILS, [PARAMS, overrides, str(both_bad)], _env(prefect.client_env()), timeout=300)
    assert "REFUSED humaneval, multiarith: great-expectations" in res.stdout, res.stderr[-4000:]
    report = (reports / "validation.md").read_text()
    assert "## multiarith / test" in report and "## humaneval / test" in report
    assert not out.exists() or not any(p.suffix == ".parquet" for p in out.rglob("*"))


def test_scheduled_deployment_run_by_worker(prefect: PrefectServer, prepared: Path, tmp_path: Path,
                                            request: pytest.FixtureRequest) -> None:
    from prefect.states import Scheduled

    env = _env(prefect.client_env() | {"AGENT_GSPO_HOME": str(ROOT)})
    for cmd in (["prefect", "work-pool", "create", "local-process", "--type", "process", "--overwrite"],
                ["prefect", "--no-prompt", "deploy", "-n", "evaluate"]):
        out = subprocess.run([sys.executable, "-m", *cmd], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, f"{cmd}: {out.stdout[-3000:]}{out.stderr[-3000:]}"
    uri = _sqlite_uri(tmp_path, _cache_dir(request))
    params = {"profile": "default", "params": PARAMS, "model": None,
              "overrides": [*TINY, *_paths(tmp_path, prepared), "eval.benchmarks=[aqua]", f"tracking.uri={uri}"]}
    with _client(prefect.api_url) as pc:
        deployment = pc.read_deployment_by_name("agent-gspo-evaluate/evaluate")
        assert deployment.work_pool_name == "local-process"
        run = pc.create_flow_run_from_deployment(deployment.id, parameters=params, state=Scheduled(
            scheduled_time=datetime.now(UTC) - timedelta(seconds=30)))
    worker = run_worker_once(env, tmp_path, "itest-worker", 300)
    with _client(prefect.api_url) as pc:
        done = pc.read_flow_run(run.id)
        tasks = _task_runs(pc, [run.id])
    log = worker.stdout[-3000:] + worker.stderr[-5000:]
    assert worker.returncode == 0, log
    assert done.state_type.value == "COMPLETED", (done.state, log)
    assert done.work_pool_name == "local-process" and done.infrastructure_pid, done
    assert str(run.id) in log  # this worker submitted it
    assert [t.name.rsplit("-", 1)[0] for t in tasks] == ["evaluate"] and tasks[0].state_type.value == "COMPLETED"
    assert (tmp_path / "eval").is_dir() and any((tmp_path / "eval").iterdir())


def _train_cmd(overrides: list[str], *extra: str) -> list[str]:
    return [sys.executable, "-m", "components.runtime.train_main", "--params", PARAMS,
            *[a for s in overrides for a in ("--set", s)], *extra]


SECRET_STORAGE = "S3cr/et@:pw"  # planted in a URI: '/', '@' and ':' in the password, unencoded


def test_training_survives_mlflow_outage(mlflow_srv: MlflowServer, prepared: Path, tmp_path: Path) -> None:
    """The server dies after step 2 and stays down past the end of training (well beyond MLflow's own
    HTTP retries): training goes on, every checkpoint is written, the end waits for the server, and
    after the restart the same run gets every step's metrics and the model is registered. A password
    in the tracking URI and in another URI setting appears in no output, param, tag or file.

    The server comes back once training has ended, at least ``min_down_s`` after it died, and once the
    metric outbox has failed ``down_tries`` tries in a row (each one fails only after MLflow's own HTTP
    retries, 3 with backoff 1 s, ~7 s, gave up): the outage outlasts those retries several times over,
    as 120 s of sleep did, but the restart lands during the outbox's 10 s back-off, not a 60 s one."""
    from mlflow import MlflowClient

    from components.runtime.checkpoint import list_checkpoints, read_meta

    steps, down_tries, min_down_s = 8, 4, 30.0
    tracking_secret = "pw" + os.urandom(6).hex()  # URL-safe: it must work as real basic-auth credentials
    uri = mlflow_srv.url.replace("http://", f"http://agent:{tracking_secret}@")
    overrides = [*TINY, *_paths(tmp_path, prepared), f"gspo.steps={steps}", f"gspo.keep_checkpoints={steps}",
                 "tracking.outage_wait_s=600", f"tracking.uri={uri}",
                 f"search.storage=postgresql+psycopg://agent:{SECRET_STORAGE}@db.invalid:5432/optuna"]
    proc = subprocess.Popen(_train_cmd(overrides), cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    t_stop = restarted = None
    ended = outlasted = False
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(f"step 2/{steps}"):
                mlflow_srv.stop()
                t_stop = time.monotonic()
            ended = ended or line.startswith(f"step {steps}/{steps}")  # all steps ran while the server was down
            outlasted = outlasted or f"tracking still unavailable, try {down_tries} " in line
            if ended and outlasted:
                break  # the run now waits for the server; the outbox just began its back-off after try 4
        assert t_stop is not None and ended and outlasted, "".join(lines)[-4000:]
        time.sleep(max(0.0, min_down_s - (time.monotonic() - t_stop)))
        assert proc.poll() is None, "training gave up during the outage:\n" + "".join(lines)[-4000:]
        mlflow_srv.restart()
        restarted = time.monotonic()
        rest, _ = proc.communicate(timeout=300)
        lines.append(rest)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    text = "".join(lines)
    print(f"server down {restarted - t_stop:.0f} s; training went on and finished after the restart")
    assert proc.returncode == 0, text[-4000:]
    assert "tracking unavailable" in text and "tracking is back" in text, text[-4000:]
    out = tmp_path / "run"
    assert [read_meta(c).step for c in list_checkpoints(out)] == list(range(1, steps + 1))  # none lost
    assert (out / "final" / "model.safetensors").is_file()

    client = MlflowClient(mlflow_srv.url)
    (run,) = client.search_runs([client.get_experiment_by_name("agent-gspo").experiment_id])
    assert run.info.status == "FINISHED"
    assert {m.step for m in client.get_metric_history(run.info.run_id, "train/reward")} == set(range(1, steps + 1))
    (version,) = client.search_model_versions("name='agent-gspo-policy'")
    assert version.tags["train.run_id"] == run.info.run_id
    assert_secrets_absent([tracking_secret, SECRET_STORAGE], text, repr(run.data.params), repr(run.data.tags),
                          repr(version.tags), folders=(out / "checkpoints", out / "plots"))
    assert run.data.params["tracking.uri"].startswith("http://agent:***@")


TRAIN_ONLY = """
import json, sys
from prefect import flow
from components.jobs import ConfigSource
from flows.pipeline import train_task

@flow(name="train-only")
def train_only(params: str, overrides: list[str]) -> dict:
    source = ConfigSource(params=params, overrides=tuple(overrides))
    return train_task(source.load(), source)

state = train_only(sys.argv[1], json.loads(sys.argv[2]), return_state=True)
print("FLOW_RUN", state.state_details.flow_run_id, flush=True)
print("RESULT", json.dumps(state.result(), default=str), flush=True)
"""


def _kill_after_first_checkpoint(out: Path, killed: list[int], stop: threading.Event) -> None:
    """Watcher: SIGKILL the train_main process writing into ``out`` once checkpoint 1 is complete."""
    import psutil

    marker = out / "checkpoints" / "step-000001" / "meta.json"
    deadline = time.monotonic() + 300
    while not stop.is_set() and time.monotonic() < deadline:
        if marker.exists():
            for proc in psutil.process_iter(["pid", "cmdline"]):
                cmd = " ".join(proc.info["cmdline"] or [])
                if "components.runtime.train_main" in cmd and f"gspo.out_dir={out}" in cmd:
                    os.kill(proc.info["pid"], signal.SIGKILL)
                    killed.append(proc.info["pid"])
            if killed:
                return
        time.sleep(0.01)


def test_training_killed_in_flow_is_resumed_by_retry(prefect: PrefectServer, prepared: Path, tmp_path: Path,
                                                      request: pytest.FixtureRequest) -> None:
    from safetensors.torch import load_file

    steps = 6
    uri = _sqlite_uri(tmp_path, _cache_dir(request))
    base = [*TINY, f"data.out_dir={prepared}", f"gspo.steps={steps}", "tracking.log_model=false",
            f"search.storage=postgresql+psycopg://agent:{SECRET_STORAGE}@db.invalid:5432/optuna"]
    straight, flowed = tmp_path / "straight", tmp_path / "flowed"
    ref = subprocess.run(_train_cmd([*base, f"gspo.out_dir={straight}"], "--no-track"), cwd=ROOT, env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]

    killed: list[int] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_kill_after_first_checkpoint, args=(flowed, killed, stop), daemon=True)
    watcher.start()
    try:
        res = _run_python(TRAIN_ONLY, [PARAMS, json.dumps([*base, f"gspo.out_dir={flowed}", f"tracking.uri={uri}"])],
                          _env(prefect.client_env()), timeout=420)
    finally:
        stop.set()
        watcher.join(10)
    text = res.stdout + res.stderr
    assert res.returncode == 0, text[-6000:]
    assert killed, "the watcher never saw checkpoint 1 (or no train_main process to kill)"
    assert "attempt 2 (resume)" in text and "--resume" in text, text[-4000:]
    assert "resumed from" in text
    flow_run_id = _marker(res.stdout, "FLOW_RUN")
    with _client(prefect.api_url) as pc:
        assert pc.read_flow_run(flow_run_id).state_type.value == "COMPLETED"
        (train,) = _task_runs(pc, [flow_run_id])
    assert train.state_type.value == "COMPLETED" and train.run_count == 2, (train.state, train.run_count)
    with _client(prefect.api_url) as pc:
        from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

        logs = pc.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    stored = "\n".join(log.message for log in logs)
    assert "attempt 2 (resume)" in stored and "agent:***@db.invalid" in stored, stored[-3000:]
    assert_secrets_absent([SECRET_STORAGE], text, stored)

    a, b = (load_file(str(folder / "final" / "model.safetensors")) for folder in (straight, flowed))
    assert a.keys() == b.keys()
    assert all(a[k].equal(b[k]) for k in a), [k for k in a if not a[k].equal(b[k])][:5]
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]  # noqa: E731
    assert strip(json.loads((straight / "history.json").read_text())) == strip(
        json.loads((flowed / "history.json").read_text()))


def test_deploy_all_needs_only_the_process_pool_and_the_gpu_deployment_deploys_apart(tmp_path: Path) -> None:
    """`prefect --no-prompt deploy --all` as the README types it, on a fresh server; then the GPU file."""
    with prefect_server(tmp_path) as server:
        env = _env(server.client_env() | {"AGENT_GSPO_HOME": str(ROOT)})

        def prefect(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "prefect", *args], cwd=ROOT, env=env, capture_output=True,
                                  text=True, timeout=180)

        assert prefect("work-pool", "create", "local-process", "--type", "process").returncode == 0
        env.pop("AGENT_GSPO_HOME")  # was: "successfully created", then every scheduled run crashed
        out = prefect("--no-prompt", "deploy", "--all")
        assert out.returncode != 0 and "AGENT_GSPO_HOME must name this checkout" in out.stdout + out.stderr, \
            out.stdout[-3000:] + out.stderr[-3000:]
        with _client(server.api_url) as pc:
            assert pc.read_deployments() == []
        env["AGENT_GSPO_HOME"] = str(ROOT)
        out = prefect("--no-prompt", "deploy", "--all")
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        gpu = prefect("--no-prompt", "deploy", "--all", "--prefect-file", "infra/prefect-gpu.yaml")
        assert gpu.returncode != 0 and "agent-gspo-k8s" in gpu.stdout + gpu.stderr  # its pool does not exist yet
        assert prefect("work-pool", "create", "agent-gspo-k8s", "--type", "kubernetes", "--base-job-template",
                       "infra/k8s/prefect-base-job-template.json").returncode == 0
        gpu = prefect("--no-prompt", "deploy", "--all", "--prefect-file", "infra/prefect-gpu.yaml")
        assert gpu.returncode == 0, gpu.stdout[-3000:] + gpu.stderr[-3000:]
        with _client(server.api_url) as pc:
            deployments = {d.name: d for d in pc.read_deployments()}
    assert {name: d.work_pool_name for name, d in deployments.items()} == {
        "nightly-pipeline": "local-process", "weekly-search": "local-process", "evaluate": "local-process",
        "nightly-pipeline-gpu": "agent-gspo-k8s"}
    nightly = deployments["nightly-pipeline"]
    assert nightly.parameters["best_params"] == "search/best_params.yaml"  # the weekly search feeds the nightly run
    assert nightly.pull_steps[0]["prefect.deployments.steps.set_working_directory"]["directory"] == str(ROOT)


def test_why_a_training_failed_is_in_the_flow_logs(prefect: PrefectServer, prepared: Path, tmp_path: Path) -> None:
    """The task said 'the message is in the output above', but that output was only on the worker's
    terminal: the Prefect UI showed no reason. A bad --out (a file) fails the same way every time: no retry."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    overrides = [*TINY, f"data.out_dir={prepared}", "gspo.steps=1", "tracking.log_model=false",
                 f"gspo.out_dir={a_file}", f"tracking.uri=sqlite:///{tmp_path / 'm.db'}"]
    res = _run_python(TRAIN_ONLY, [PARAMS, json.dumps(overrides)], _env(prefect.client_env()), timeout=300)
    assert res.returncode != 0
    flow_run_id = _marker(res.stdout, "FLOW_RUN")
    with _client(prefect.api_url) as pc:
        from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

        logs = pc.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
        (train,) = _task_runs(pc, [flow_run_id])
    stored = "\n".join(log.message for log in logs)
    assert "training output, last" in stored and f"{a_file}: exists and is not a folder" in stored, stored[-3000:]
    assert train.run_count == 1  # bad input: not retried
