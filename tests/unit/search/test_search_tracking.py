"""Each trial is a nested MLflow run with its params and search metrics (sqlite:/// store)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from helpers.paths import load_test_module
from helpers.search_helpers import searching
from mlflow import MlflowClient

from components.config import Config
from components.search import Worker, mlflow_tracker_factory, run_search
from components.search.synthetic import SyntheticTrial
from components.search.tracking import log_search_metrics

test_tracking_helpers = load_test_module("test_tracking_helpers")

mlflow_uri = test_tracking_helpers.mlflow_uri  # shared pytest fixture (migrated template db)


def test_trials_are_nested_runs_with_params_and_metrics(tmp_path: Path, mlflow_uri: str) -> None:
    cfg = Config()
    cfg.tracking = cfg.tracking.model_copy(update={"uri": mlflow_uri, "experiment": "search-test"})
    cfg.search = cfg.search.model_copy(update={"out_params": str(tmp_path / "best.yaml")})
    cfg.gspo = cfg.gspo.model_copy(update={"lr": 1e-3})  # a profile the search beats: its file is logged
    result = run_search(searching(cfg, trials=3), SyntheticTrial(),
                        worker=Worker(storage=optuna.storages.InMemoryStorage(),
                        tracker_factory=mlflow_tracker_factory(cfg)))
    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name("search-test")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 3
    parent = parents[0]
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children)
    assert {c.info.run_name for c in children} == {"trial-0", "trial-1", "trial-2"}
    for child in children:
        assert child.info.status == "FINISHED"
        assert {"reward.lambda_tok", "mas.agents", "mas.topology", "gspo.eps_high"} <= set(child.data.params)
        m = child.data.metrics
        assert 0.0 <= m["search/dev_accuracy"] <= 1.0 and m["search/tokens_spent"] > 0
        assert m["search/constraint"] == pytest.approx(m["search/mean_tokens_per_episode"] - 400.0)
    assert parent.data.metrics["search/best_dev_accuracy"] == pytest.approx(result.best_dev_accuracy)
    assert parent.data.tags["best_trial"] == str(result.best_trial) and parent.data.tags["stage"] == "search"
    assert any(k.startswith("best.") for k in parent.data.params)
    artifacts = [a.path for a in client.list_artifacts(parent.info.run_id, "search")]
    assert artifacts == ["search/best.yaml"]


def test_unknown_search_metric_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown search metric"):
        log_search_metrics(object(), {"search/acc": 1.0})
