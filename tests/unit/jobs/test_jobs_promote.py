"""PromoteJob around the gate: a champion measured on the way never replaces the candidate's published
evaluation, and numbers from another ``mas`` protocol than the candidate serves are flagged.

The gate's setting is fixed here (no data is read); the tiny registered versions are real.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import gate_helpers as gh
from helpers.leaks import assert_secrets_absent
from helpers.paths import REPO_ROOT, load_test_module
from mlflow import MlflowClient

from components.config import load_config
from components.evaluation.setting import setting_of
from components.jobs import PromoteJob
from components.tracking.signing import KEY_ENV

test_tracking_helpers = load_test_module("test_tracking_helpers")
test_tracking_model_cache = load_test_module("test_tracking_model_cache")

mlflow_uri = test_tracking_helpers.mlflow_uri  # shared pytest fixtures
tiny_model = test_tracking_model_cache.tiny_model
ROOT = REPO_ROOT
NAME = "agent-gspo-policy"


def _overrides(uri: str, tmp: Path) -> list[str]:
    return ["model.name=tiny-random", "mas.agents=2", "mas.rounds=2", "mas.max_message_tokens=4", "eval.limit=1",
            "eval.benchmarks=[gsm8k]", "registry.min_accuracy=0", "registry.gate.min_items=2", f"tracking.uri={uri}",
            f"eval.out_dir={tmp / 'eval'}"]


def _cfg(uri: str, tmp: Path, *extra: str):
    return load_config(ROOT / "params.yaml", None, [*_overrides(uri, tmp), *extra])


@pytest.fixture()
def fixed_setting(monkeypatch: pytest.MonkeyPatch):
    """The gate's setting without reading data: ``planned_setting`` -> a setting of one item."""
    def planned(cfg, *, limit=None, split="test", data_dir=None):
        return setting_of(cfg, {"gsm8k": ["gsm8k-1"]}, split=split, limit=1, data_manifest_sha256="d" * 64)

    monkeypatch.setattr("components.jobs.promote.planned_setting", planned)  # imported there at module level
    return planned


def _evaluated(client: MlflowClient, cfg, version: str, acc: float, tokens: float) -> None:
    """An evaluation run with a per-item record of 4 items, the first ``round(acc * 4)`` correct."""
    key = setting_of(cfg, {"gsm8k": ["gsm8k-1"]}, split="test", limit=1, data_manifest_sha256="d" * 64)
    gh.evaluate(client, Path.cwd(), NAME, version, gh.records([i < round(acc * 4) for i in range(4)], tokens / 4),
                key.key())


def test_evaluating_the_champion_leaves_the_candidates_evaluation_in_place(
        mlflow_uri: str, tmp_path: Path, fixed_setting, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _cfg(mlflow_uri, tmp_path)
    client = MlflowClient(mlflow_uri)
    client.create_registered_model(NAME)
    v1, v2 = (str(client.create_model_version(NAME, str(tmp_path)).version) for _ in range(2))
    client.set_registered_model_alias(NAME, "champion", v1)  # a champion without results under the setting
    _evaluated(client, cfg, v2, 1.0, 100)
    published = tmp_path / "eval"
    published.mkdir()
    (published / "summary.json").write_text(json.dumps({"meta": {"model": f"models:/{NAME}/{v2}"}}))
    written: list[Path] = []

    def fake_run(job) -> SimpleNamespace:  # what EvaluateJob does, minus the model: files + version tags
        out = Path(job.out_dir or job.cfg.eval.out_dir)
        (out / "summary.json").write_text(json.dumps({"meta": {"model": job.model}}))
        written.append(out)
        _evaluated(client, cfg, job.model.rsplit("/", 1)[1], 0.0, 120)
        return SimpleNamespace(run_id="champion-run")

    monkeypatch.setattr("components.jobs.evaluate.EvaluateJob.run", fake_run)
    decision = PromoteJob(cfg=cfg, candidate=f"models:/{NAME}/{v2}", evaluate_champion=True).run()
    assert decision.decision == "champion" and decision.compared_to == v1
    assert len(written) == 1 and published not in (written[0], *written[0].parents)
    assert json.loads((published / "summary.json").read_text())["meta"]["model"] == f"models:/{NAME}/{v2}"
    assert not written[0].exists()  # a temporary folder: the measurement lives in MLflow


def _register(uri: str, model: Path, artifacts: Path, *overrides: str) -> str:
    return test_tracking_model_cache.register_in_tmp(uri, model, artifacts, NAME,
                                                     **{str(i): o for i, o in enumerate(overrides)})


def test_a_gate_measured_under_another_protocol_than_served_warns(
        mlflow_uri: str, tmp_path: Path, tiny_model: Path, fixed_setting, caplog: pytest.LogCaptureFixture) -> None:
    client = MlflowClient(mlflow_uri)
    served = _register(mlflow_uri, tiny_model, tmp_path / "art", "mas.agents=3", "mas.rounds=2")
    one_by_one = _cfg(mlflow_uri, tmp_path, "mas.agents=1", "mas.rounds=1")
    _evaluated(client, one_by_one, served, 0.5, 100)
    with caplog.at_level("WARNING"):
        decision = PromoteJob(cfg=one_by_one, candidate=f"models:/{NAME}/{served}").run()
    assert decision.decision == "champion"  # a warning, not a refusal
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert "measured under mas 1 agents x 1 rounds" in warnings[0] and f"models:/{NAME}/{served}" in warnings[0]
    assert "agents 1->3, rounds 1->2" in warnings[0] and "\n" not in warnings[0]

    caplog.clear()
    same = _cfg(mlflow_uri, tmp_path, "mas.agents=3", "mas.rounds=2")
    v2 = _register(mlflow_uri, tiny_model, tmp_path / "art", "mas.agents=3", "mas.rounds=2")
    _evaluated(client, same, served, 0.5, 100)  # the champion, measured as it serves
    _evaluated(client, same, v2, 0.5, 100)
    with caplog.at_level("WARNING"):
        PromoteJob(cfg=same, candidate=f"models:/{NAME}/{v2}").run()
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_a_version_without_recorded_settings_is_promoted_without_a_warning(
        mlflow_uri: str, tmp_path: Path, fixed_setting, caplog: pytest.LogCaptureFixture) -> None:
    cfg = _cfg(mlflow_uri, tmp_path)
    client = MlflowClient(mlflow_uri)
    client.create_registered_model(NAME)
    v1 = str(client.create_model_version(NAME, str(tmp_path)).version)
    _evaluated(client, cfg, v1, 0.5, 100)
    with caplog.at_level("WARNING"):
        assert PromoteJob(cfg=cfg, candidate=f"models:/{NAME}/{v1}").run().decision == "champion"
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_cli_prints_one_block_and_refuses_edited_tags_with_exit_2(
        mlflow_uri: str, tmp_path: Path, fixed_setting, capsys: pytest.CaptureFixture) -> None:
    """``agent-gspo promote``: the rule, the intervals and the decision in one block; a version whose
    tags were edited after its evaluation is exit 2 with one line naming the tag and both values."""
    from components.cli import main

    cfg = _cfg(mlflow_uri, tmp_path)
    client = MlflowClient(mlflow_uri)
    client.create_registered_model(NAME)
    v1, v2, v3 = (str(client.create_model_version(NAME, str(tmp_path)).version) for _ in range(3))
    for version, acc in ((v1, 0.0), (v2, 1.0), (v3, 0.0)):
        _evaluated(client, cfg, version, acc, 100)
    sets = [x for o in _overrides(mlflow_uri, tmp_path) for x in ("--set", o)]
    argv = ["promote", "--params", str(ROOT / "params.yaml"), *sets]
    assert main([*argv, "--candidate", f"models:/{NAME}/{v1}"]) == 0
    assert main([*argv, "--candidate", f"models:/{NAME}/{v2}"]) == 0
    out = capsys.readouterr().out.splitlines()
    block = out[out.index(next(line for line in out if line.startswith(f"{NAME} v{v2} under setting"))):]
    assert block[1].startswith("  rule: paired t, one-sided 95%") and "at least 2 items" in block[1]
    assert block[2] == f"  compared with v{v1} on 4 paired items (gsm8k)"
    assert block[3].startswith("  accuracy difference: +1.0000 (SE 0.0000")
    assert block[5] == "  decision: champion - better: more accurate beyond noise (lower bound +1.0000 > 0) at " \
                       "1.000x <= 1.1x tokens"
    client.set_model_version_tag(NAME, v3, "eval." + fixed_setting(cfg).key() + ".accuracy", "1.0")
    assert main([*argv, "--candidate", f"models:/{NAME}/{v3}"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("agent-gspo")]
    assert len(err) == 1 and "accuracy = 1 but its verified per-item record" in err[0] and "gives 0" in err[0]


def test_cli_refuses_a_fabricated_record_in_one_line_and_the_key_is_nowhere(
        mlflow_uri: str, tmp_path: Path, fixed_setting, capsys: pytest.CaptureFixture,
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/gate.md's attack through ``agent-gspo promote``: a run made with plain ``MlflowClient`` calls
    (every answer correct; the old gate crowned it ``better``) and one carrying a genuine run's signature
    are exit 2, one line naming the version, the run and why. The team's key (``$AGENT_GSPO_SIGNING_KEY``)
    appears in no output, log, MLflow param, tag or artifact, and no key file is generated beside it."""
    from components.cli import main

    planted = "team-key-" + secrets.token_hex(24)
    monkeypatch.setenv(KEY_ENV, planted)
    cfg = _cfg(mlflow_uri, tmp_path)
    client = MlflowClient(mlflow_uri)
    client.create_registered_model(NAME)
    v1, v2, v3 = (str(client.create_model_version(NAME, str(tmp_path)).version) for _ in range(3))
    _evaluated(client, cfg, v1, 0.5, 100)
    key = fixed_setting(cfg).key()
    forged = gh.forge(client, tmp_path, NAME, v2, gh.records([True] * 4, 25), key)
    copied = gh.forge(client, tmp_path, NAME, v3, gh.records([True] * 4, 25), key)
    genuine = client.get_run(client.get_model_version(NAME, v1).tags[f"eval.{key}.run_id"]).data.params
    client.log_param(copied, "eval.signature", genuine["eval.signature"])
    argv = ["promote", "--params", str(ROOT / "params.yaml"),
            *[x for o in _overrides(mlflow_uri, tmp_path) for x in ("--set", o)]]
    with caplog.at_level("DEBUG"):
        assert main([*argv, "--candidate", f"models:/{NAME}/{v1}"]) == 0
        shown = list(capsys.readouterr())
        for version, run, why in ((v2, forged, "unsigned: "), (v3, copied, "signature does not match: ")):
            assert main([*argv, "--candidate", f"models:/{NAME}/{version}"]) == 2
            out, err = capsys.readouterr()
            shown += [out, err]
            lines = [line for line in err.splitlines() if line.startswith("agent-gspo")]
            assert len(lines) == 1 and f"models:/{NAME}/{version}: evaluation run {run} refused, {why}" in lines[0]
            assert "decision:" not in out
    assert str(client.get_model_version_by_alias(NAME, "champion").version) == v1
    assert not list(tmp_path.rglob("*.signing-key"))
    stored = [repr(r.data.params) + repr(r.data.tags) for r in client.search_runs(
        [e.experiment_id for e in client.search_experiments()])]
    assert_secrets_absent([planted], *shown, caplog.text, *stored, folders=(tmp_path,))  # db, artifacts
