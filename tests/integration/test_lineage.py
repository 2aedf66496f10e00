"""Lineage in MLflow's own fields, read back from a SQLite store after a tracked train and evaluate.

* the training run and the evaluation run list the prepared splits they read as dataset inputs
  (``<benchmark>/<split>``, digest = the manifest's content hash of the parquet file, source = its
  path, context ``training`` / ``evaluation``);
* the evaluation run of a registered version lists that version's logged model among its inputs;
* the registered model carries an input example consistent with its signature.

Was: none of the three (the evaluated model was linked only through the metrics' ``model_id``).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import mlflow
import pytest
from helpers.paths import REPO_ROOT, find_under_tests
from mlflow import MlflowClient
from mlflow.models.utils import _enforce_schema

from components.config import load_config
from components.jobs import EvaluateJob, TrainJob

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = REPO_ROOT
_spec = importlib.util.spec_from_file_location(
    "test_tracking_helpers", find_under_tests("test_tracking_helpers.py"))
helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(helpers)
mlflow_uri = helpers.mlflow_uri  # the shared fixture: a migrated sqlite store in tmp_path (also the cwd)


def _inputs(client: MlflowClient, run_id: str) -> dict[str, tuple[str, dict, str]]:
    """name -> (digest, source, context) of a run's dataset inputs."""
    out = {}
    for inp in client.get_run(run_id).inputs.dataset_inputs:
        context = {t.key: t.value for t in inp.tags}.get("mlflow.data.context", "")
        out[inp.dataset.name] = (inp.dataset.digest, json.loads(inp.dataset.source), context)
    return out


def test_train_and_evaluate_record_their_data_and_model_as_run_inputs(
        mlflow_uri: str, prepared_data: Path, tmp_path: Path, one_thread) -> None:
    cfg = load_config(ROOT / "params.yaml", None, [
        f"data.out_dir={prepared_data}", "model.name=tiny-random", "gspo.engine=torch", "gspo.steps=1",
        "gspo.questions_per_step=2", "gspo.group_size=2", "gspo.minibatches=1", "mas.agents=2", "mas.rounds=1",
        "mas.max_message_tokens=4", "eval.limit=1", "eval.benchmarks=[gsm8k,aqua]", "eval.baselines=[]",
        "data.train_sources=[gsm8k/train]", f"tracking.uri={mlflow_uri}", "tracking.experiment=lineage",
        f"gspo.out_dir={tmp_path / 'run'}", f"eval.out_dir={tmp_path / 'eval'}"])
    manifest = json.loads((prepared_data / "manifest.json").read_text())["benchmarks"]

    def digest(bench: str, split: str) -> str:
        return manifest[bench]["output_sha256"][f"{bench}/{split}.parquet"][:36]  # MLflow's digest limit

    client = MlflowClient(mlflow_uri)
    trained = TrainJob(cfg=cfg, max_steps=1, overwrite=True).run()
    assert trained.run_id and trained.model_version
    train_path = str((prepared_data / "gsm8k" / "train.parquet").resolve())
    assert _inputs(client, trained.run_id) == {"gsm8k/train": (digest("gsm8k", "train"), {"uri": train_path},
                                                               "training")}

    name = cfg.registry.model_name
    evaluated = EvaluateJob(cfg=cfg, model=f"models:/{name}/{trained.model_version}").run()
    assert _inputs(client, evaluated.run_id) == {
        f"{b}/test": (digest(b, "test"), {"uri": str((prepared_data / b / "test.parquet").resolve())}, "evaluation")
        for b in ("gsm8k", "aqua")}
    mv = client.get_model_version(name, trained.model_version)
    model_inputs = client.get_run(evaluated.run_id).inputs.model_inputs
    assert [m.model_id for m in model_inputs] == [mv.model_id or mv.source.removeprefix("models:/")]

    info = mlflow.models.get_model_info(f"models:/{name}/{trained.model_version}")
    assert info.saved_input_example_info is not None
    example = mlflow.models.Model.load(f"models:/{name}/{trained.model_version}").load_input_example()
    assert list(example["question"]) and set(example.columns) <= {"question", "answer_type", "choices"}
    _enforce_schema(example, info.signature.inputs)  # consistent with the signature (raises otherwise)
