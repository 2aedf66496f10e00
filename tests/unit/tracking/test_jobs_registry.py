"""Evaluate and promote jobs against a sqlite registry: runs linked to versions, settings kept apart.

A tiny random policy is registered (as training does) and evaluated on one real item of gsm8k and
aqua; what is checked is where the numbers land, not what they are, and that two versions of the
same weights tie (the second stays @challenger). The evaluations are signed with the key of
``$AGENT_GSPO_SIGNING_KEY``, which appears in no log, MLflow param or tag, or file.
"""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path

import pytest
from helpers.leaks import assert_secrets_absent
from helpers.paths import REPO_ROOT, load_test_module
from mlflow import MlflowClient

from components.config import load_config
from components.jobs import EvaluateJob, PromoteJob
from components.tracking import CandidateNotEvaluated, ChampionNotEvaluated, log_policy_model, read_result
from components.tracking.signing import KEY_ENV
from components.tracking.versions import VersionRef, write_registration

test_tracking_helpers = load_test_module("test_tracking_helpers")

mlflow_uri = test_tracking_helpers.mlflow_uri  # shared pytest fixture
ROOT = REPO_ROOT
pytestmark = pytest.mark.slow


def _cfg(uri: str, data: Path, tmp: Path, *extra: str):
    return load_config(ROOT / "params.yaml", None, [
        "model.name=tiny-random", "mas.agents=2", "mas.rounds=1", "mas.max_message_tokens=4", "eval.limit=1",
        "eval.benchmarks=[gsm8k,aqua]", "eval.baselines=[]", "registry.min_accuracy=0", "registry.gate.min_items=2",
        f"tracking.uri={uri}",
        f"data.out_dir={data}", f"eval.out_dir={tmp / 'eval'}", "tracking.experiment=jobs", *extra])


def test_evaluate_links_run_and_version_and_promote_compares_like_with_like(
        mlflow_uri: str, prepared_data: Path, tmp_path: Path, one_thread, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    planted = "team-key-" + secrets.token_hex(24)  # the signing key, shared as a team would: never stored or shown
    monkeypatch.setenv(KEY_ENV, planted)
    caplog.set_level("DEBUG")
    client = MlflowClient(mlflow_uri)
    cfg = _cfg(mlflow_uri, prepared_data, tmp_path)
    policy = test_tracking_helpers.save_tiny_chat_model(tmp_path / "policy")
    settings = test_tracking_helpers.system_settings()
    v1, v2 = (str(log_policy_model(policy, registered_name=cfg.registry.model_name, tags={}, settings=settings,
                                   tracking_uri=mlflow_uri).version) for _ in range(2))
    name = cfg.registry.model_name

    full = EvaluateJob(cfg=cfg, model=f"models:/{name}/{v1}").run()
    key = full.setting.key()
    run = client.get_run(full.run_id)
    assert run.data.params["setting.key"] == key and run.data.params["setting.benchmarks"] == "aqua,gsm8k"
    assert run.data.params["eval.limit"] == "1" and run.data.params["setting.protocol.agents"] == "2"
    assert run.data.metrics["eval/accuracy"] == full.main["accuracy"]
    assert run.data.metrics["eval/tokens_total"] == full.main["tokens_total"] > 0
    assert "eval/gsm8k/accuracy" in run.data.metrics
    assert (run.data.tags["eval.model_name"], run.data.tags["eval.model_version"]) == (name, v1)
    # the per-item record: an artifact whose sha256 is an immutable param, and an evaluation table
    assert run.data.params["eval.registered_version"] == f"models:/{name}/{v1}"
    assert run.data.params["eval.items_sha256"] == full.report.meta["items_sha256"]
    assert re.fullmatch(r"v1:[0-9a-f]{12}:[0-9a-f]{64}", run.data.params["eval.signature"])  # signed with the key
    assert {"eval/items.jsonl", "eval_items.json"} <= {a.path for a in client.list_artifacts(full.run_id)} | {
        a.path for a in client.list_artifacts(full.run_id, "eval")}
    mv = client.get_model_version(name, v1)
    assert mv.tags[f"eval.{key}.run_id"] == full.run_id and mv.tags["eval.latest_run_id"] == full.run_id
    linked = {m.key: m.value for m in client.get_logged_model(mv.model_id or mv.source.split("/")[-1]).metrics}
    assert linked["eval/accuracy"] == full.main["accuracy"]  # on the version's page in the MLflow UI too

    partial = EvaluateJob(cfg=_cfg(mlflow_uri, prepared_data, tmp_path, "eval.benchmarks=[gsm8k]"),
                          model=f"models:/{name}/{v2}").run()
    assert partial.setting.key() != key
    assert PromoteJob(cfg=cfg, candidate=f"models:/{name}/{v1}").run().decision == "champion"
    with pytest.raises(CandidateNotEvaluated, match=f"models:/{name}/{v2} has no evaluation"):
        PromoteJob(cfg=cfg, candidate=f"models:/{name}/{v2}").run()
    assert read_result(client.get_model_version(name, v1).tags, key, "v1").run_id == full.run_id

    # a trained folder that knows its registry version (the DVC pipeline evaluates the folder)
    write_registration(policy, VersionRef(name, v2), uri=mlflow_uri, run_id=client.get_model_version(name, v2).run_id)
    by_folder = EvaluateJob(cfg=cfg, model=str(policy)).run()
    assert by_folder.version == VersionRef(name, v2) and by_folder.setting.key() == key
    tie = PromoteJob(cfg=cfg).run()  # same weights, same items, same answers: a tie never takes over
    assert tie.decision == "challenger" and tie.verdict.outcome == "tie" and tie.compared_to == v1
    assert client.get_registered_model(name).aliases == {"champion": int(v1), "challenger": int(v2)} or str(
        client.get_model_version_by_alias(name, "champion").version) == v1

    # the gate's setting changes (2 items): the champion has no numbers there until it is measured
    two = _cfg(mlflow_uri, prepared_data, tmp_path, "eval.limit=2")
    v3 = str(log_policy_model(policy, registered_name=name, tags={}, settings=settings,
                              tracking_uri=mlflow_uri).version)
    EvaluateJob(cfg=two, model=f"models:/{name}/{v3}").run()
    with pytest.raises(ChampionNotEvaluated, match=f"champion models:/{name}/{v1}"):
        PromoteJob(cfg=two, candidate=f"models:/{name}/{v3}").run()
    decision = PromoteJob(cfg=two, candidate=f"models:/{name}/{v3}", evaluate_champion=True).run()
    assert decision.decision == "challenger" and decision.compared_to == v1 and decision.setting != key
    assert decision.verdict.outcome == "tie" and decision.verdict.n == 4
    assert read_result(client.get_model_version(name, v1).tags, decision.setting, "v1") is not None
    print(decision.block())  # docs/gate.md quotes this block
    strict = PromoteJob(cfg=_cfg(mlflow_uri, prepared_data, tmp_path, "eval.limit=2", "registry.gate.min_items=50"),
                        candidate=f"models:/{name}/{v3}").run()
    assert strict.decision == "refused" and "\n" not in strict.block()  # 4 items decide nothing under min_items 50
    print(strict.block())
    # the champion's measurement went elsewhere: eval.out_dir still holds the candidate's published evaluation
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["meta"]["model"] == f"models:/{name}/{v3}"
    stored = [repr(r.data.params) + repr(r.data.tags) for r in client.search_runs(
        [e.experiment_id for e in client.search_experiments()])]
    stored += [repr(mv.tags) for mv in client.search_model_versions(f"name = '{name}'")]
    assert_secrets_absent([planted], caplog.text, *stored, folders=(tmp_path,))  # db, artifacts, eval folder
    assert not list(tmp_path.rglob("*.signing-key"))
