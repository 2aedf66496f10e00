"""Promotion gate on per-item evidence (sqlite:/// store, fabricated per-item records): ties stay
challenger, too few or different items decide nothing, a paired improvement is promoted, edited
tags and replaced records are refused, deleted tags and aliases do not crown a bad model; plus
idempotency and concurrency."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import gate_helpers as gh
from helpers.paths import load_test_module
from mlflow import MlflowClient

from components.comparison import ComparisonRule
from components.tracking import (
    CandidateNotEvaluated,
    ChampionNotEvaluated,
    EvidenceMismatch,
    GateRule,
    PromotionDecision,
    PromotionError,
    promotion_lock,
)
from components.tracking import promote as _promote
from components.tracking.decision_log import crownings, experiment_name
from components.tracking.promotion import GateSpec

test_tracking_helpers = load_test_module("test_tracking_helpers")

mlflow_uri = test_tracking_helpers.mlflow_uri  # shared pytest fixture
RULE = GateRule(ComparisonRule(min_items=20), min_accuracy=0.5)
KEY = gh.KEY


def promote(client: MlflowClient, name: str, version: str, **kw) -> PromotionDecision:
    """The gate under ``KEY`` and ``RULE`` (or ``setting_key=``, ``rule=``), trusting what this registry's
    signing key signed (or ``trust=``)."""
    spec = GateSpec(kw.pop("setting_key", KEY), kw.pop("rule", RULE), trust=kw.pop("trust", None) or gh.trust(client))
    return _promote(client, name, version, gate=spec, **kw)


def _alias(client: MlflowClient, name: str, alias: str) -> str | None:
    aliases = client.get_registered_model(name).aliases
    return str(aliases[alias]) if alias in aliases else None


@pytest.fixture()
def setup(mlflow_uri: str, tmp_path: Path) -> tuple[MlflowClient, Callable[..., str]]:
    client = MlflowClient(mlflow_uri)
    return client, lambda name, acc, tok, **kw: gh.version(client, tmp_path, name, acc, tok, **kw)


def test_first_model_needs_min_items_and_min_accuracy(setup) -> None:
    client, new = setup
    few = new("m", 1.0, 100, n=5)  # perfect, but on 5 items: nothing decided, nothing written
    d = promote(client, "m", few)
    assert d.decision == "refused" and "too few items (5 < min_items 20)" in d.reason and "\n" not in d.block()
    assert _alias(client, "m", "champion") is None and "promotion.decision" not in client.get_model_version(
        "m", few).tags
    low = new("m", 0.4, 100)
    assert promote(client, "m", low).decision == "rejected" and _alias(client, "m", "champion") is None
    v = new("m", 0.6, 100)
    d = promote(client, "m", v)
    assert d.decision == "champion" and d.compared_to is None and _alias(client, "m", "champion") == v
    tags = client.get_model_version("m", v).tags
    assert tags["promotion.rule.min_items"] == "20" and tags["promotion.rule.confidence"] == "0.95"
    assert tags["promotion.candidate_items_sha256"]
    assert [c.version for c in crownings(client, "m", gh.trust(client))] == [v]


def test_a_tie_stays_challenger(setup) -> None:
    """Identical per-item records (weights that never changed): never better, whatever the tags."""
    client, new = setup
    v1 = new("m", 0.6, 6000)
    promote(client, "m", v1)
    v2 = new("m", 0.6, 6000)
    d = promote(client, "m", v2)
    assert d.decision == "challenger" and d.reason.startswith("tie: no difference beyond noise")
    assert _alias(client, "m", "champion") == v1 and _alias(client, "m", "challenger") == v2
    block = d.block()
    assert "rule: paired t" in block and "accuracy difference: +0.0000" in block and "decision: challenger" in block


def test_a_paired_improvement_is_promoted_a_worse_one_is_not(setup) -> None:
    client, new = setup
    v1 = new("m", 0.5, 6000)
    promote(client, "m", v1)
    v2 = new("m", 0.9, 6000)  # every item v1 got right, and 24 more
    d = promote(client, "m", v2)
    assert d.decision == "champion" and d.verdict.outcome == "better" and d.compared_to == v1
    assert _alias(client, "m", "champion") == v2
    assert client.get_model_version("m", v1).tags["promotion.superseded_by"] == v2
    assert d.metrics_used["accuracy_low"] > 0 and d.metrics_used["champion_accuracy"] == pytest.approx(0.5)
    v3 = new("m", 0.5, 6000)
    assert promote(client, "m", v3).decision == "challenger" and _alias(client, "m", "champion") == v2
    v4 = new("m", 0.9, 3000)  # as accurate, half the tokens
    d = promote(client, "m", v4)
    assert d.decision == "champion" and d.verdict.outcome == "cheaper"


def test_too_few_or_different_items_decide_nothing(setup) -> None:
    client, new = setup
    v1 = new("m", 0.6, 6000)
    promote(client, "m", v1)
    gh.evaluate(client, Path.cwd(), "m", v1, gh.records([True], 100), key="onekey")
    one = new("m", 0.0, 100, key="onekey", n=1)
    d = promote(client, "m", one, setting_key="onekey")
    assert d.decision == "refused" and d.reason.startswith("too few items: 1 < min_items 20")
    assert d.block().count("\n") == 0 and _alias(client, "m", "champion") == v1
    assert _alias(client, "m", "challenger") is None and "promotion.decision" not in client.get_model_version(
        "m", one).tags
    other = gh.register(client, Path.cwd(), "m")
    gh.evaluate(client, Path.cwd(), "m", other, gh.records([True] * 60, 10, ids=[f"x{i}" for i in range(60)]))
    d = promote(client, "m", other)
    assert d.decision == "refused" and d.reason.startswith("incomparable items: gsm8k: the evaluations hold different")


def test_edited_tags_are_refused_naming_both_values(setup) -> None:
    client, new = setup
    v1 = new("m", 0.6, 6000)
    promote(client, "m", v1)
    v2 = new("m", 0.0, 6000)
    client.set_model_version_tag("m", v2, f"eval.{KEY}.accuracy", "0.99")
    client.set_model_version_tag("m", v2, f"eval.{KEY}.tokens_total", "100")
    with pytest.raises(EvidenceMismatch, match=rf"candidate models:/m/{v2}: tag eval.{KEY}.accuracy = 0.99 but "
                       r"its verified per-item record \(run \w+\) gives 0"):
        promote(client, "m", v2)
    client.set_model_version_tag("m", v1, f"eval.{KEY}.tokens_total", "1")  # the champion's tags are checked too
    v3 = new("m", 0.6, 6000)
    with pytest.raises(EvidenceMismatch, match=rf"champion models:/m/{v1}: tag eval.{KEY}.tokens_total = 1 but"):
        promote(client, "m", v3)
    assert _alias(client, "m", "champion") == v1


def test_a_replaced_record_or_a_borrowed_run_is_refused(setup) -> None:
    client, new = setup
    v1 = new("m", 0.0, 6000)
    run = client.get_model_version("m", v1).tags[f"eval.{KEY}.run_id"]
    gh.replace_items(client, Path.cwd(), run, gh.records([True] * 60, 100))
    with pytest.raises(EvidenceMismatch, match=r"has sha256 \w+, but the run's param eval.items_sha256 = \w+"):
        promote(client, "m", v1)
    good = new("m", 0.9, 6000)
    v2 = new("m", 0.0, 6000)
    for field in ("run_id", "accuracy", "tokens_total", "n"):  # v2's tags copied from a good version
        tag = f"eval.{KEY}.{field}"
        client.set_model_version_tag("m", v2, tag, client.get_model_version("m", good).tags[tag])
    with pytest.raises(EvidenceMismatch, match=f"measured models:/m/{good}, not models:/m/{v2}"):
        promote(client, "m", v2)


def test_deleting_gate_tags_and_alias_does_not_crown_a_bad_model(setup) -> None:
    client, new = setup
    v1 = new("m", 0.8, 6000)
    promote(client, "m", v1)
    client.delete_registered_model_alias("m", "champion")
    for tag in list(client.get_registered_model("m").tags):
        client.delete_registered_model_tag("m", tag)
    for tag in [t for t in client.get_model_version("m", v1).tags if t.startswith("promotion.")]:
        client.delete_model_version_tag("m", v1, tag)  # the version's promotion record too
    exp = client.get_experiment_by_name(experiment_name("m"))
    for run in client.search_runs([exp.experiment_id]):
        client.delete_run(run.info.run_id)  # and the decision log (soft delete)
    bad = new("m", 0.0, 6000)
    d = promote(client, "m", bad)
    assert d.decision == "challenger" and d.compared_to == v1 and d.verdict.outcome == "worse"
    assert _alias(client, "m", "champion") is None
    client.delete_model_version("m", v1)  # even the crowned version itself: its logged evaluation is the bar
    bad2 = new("m", 0.0, 6000)
    d = promote(client, "m", bad2)
    assert d.decision == "challenger" and d.compared_to == v1


def test_missing_champion_record_asks_for_an_evaluation(setup) -> None:
    client, new = setup
    v1 = new("m", 0.8, 6000)
    promote(client, "m", v1)
    v2 = new("m", 0.8, 6000, key="other")
    with pytest.raises(ChampionNotEvaluated, match=f"champion models:/m/{v1} has no per-item record") as exc:
        promote(client, "m", v2, setting_key="other")
    assert exc.value.champion == v1
    with pytest.raises(CandidateNotEvaluated, match=f"models:/m/{v2} has no evaluation"):
        promote(client, "m", v2)


def test_a_champion_without_items_or_crowning_is_named(setup, caplog: pytest.LogCaptureFixture) -> None:
    """An evaluation from before per-item records asks for a new one; an alias set by hand is a warning."""
    from components.tracking import GateResult, write_result

    client, new = setup
    old = new("m", None, None)
    client.set_registered_model_alias("m", "champion", old)
    run = client.create_run(client.create_experiment("old-evals")).info.run_id  # aggregates only, no items
    write_result(client, "m", old, KEY, {}, GateResult(0.9, 100, 60, run))
    v2 = new("m", 0.6, 6000)
    with caplog.at_level("WARNING"), pytest.raises(ChampionNotEvaluated, match=f"models:/m/{old} has no per-item"):
        promote(client, "m", v2)
    assert f"@champion of 'm' is v{old}, which no promotion decision crowned" in caplog.text


def test_rerun_is_idempotent(setup) -> None:
    client, new = setup
    v1 = new("m", 0.6, 6000)
    promote(client, "m", v1)
    v2 = new("m", 0.6, 6000)
    assert promote(client, "m", v2).decision == "challenger"
    before = client.get_model_version("m", v2).tags["promotion.decided_at"]
    again = promote(client, "m", v2)
    assert again.decision == "unchanged" and again.reason.startswith("already challenger")
    assert client.get_model_version("m", v2).tags["promotion.decided_at"] == before
    assert promote(client, "m", v1).decision == "unchanged"


def _race(client_uri: str, name: str, versions: list[str], lock: str) -> tuple[list[PromotionDecision],
                                                                           list[BaseException]]:
    results: list[PromotionDecision] = []
    errors: list[BaseException] = []

    def worker(version: str) -> None:
        try:
            results.append(promote(MlflowClient(client_uri), name, version, lock=lock))
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(v,)) for v in versions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results, errors


@pytest.mark.parametrize("lock", ["file", "tag"])
def test_concurrent_promotions_serialise(mlflow_uri: str, setup, lock: str, monkeypatch: pytest.MonkeyPatch) -> None:
    client, new = setup
    v1 = new("m", 0.5, 6000)
    promote(client, "m", v1)
    v2, v3 = new("m", 0.9, 6000), new("m", 0.9, 2000)  # both beat v1; v3 is also cheaper than v2
    from components.tracking import promotion

    real = promotion._reference

    def slow(*args, **kw):  # widens the read-decide-write window
        time.sleep(0.3)
        return real(*args, **kw)

    monkeypatch.setattr(promotion, "_reference", slow)
    results, errors = _race(mlflow_uri, "m", [v2, v3], lock)
    assert not errors, errors
    first, second = sorted(results, key=lambda d: d.compared_to != v1)
    assert first.compared_to == v1 and first.decision == "champion"
    assert second.compared_to == first.version  # the second saw the first one's result
    assert _alias(client, "m", "champion") == v3  # the same outcome as a sequential run
    assert "promotion.lock" not in client.get_registered_model("m").tags


def test_tag_lease_is_exclusive_expires_and_detects_loss(setup, monkeypatch: pytest.MonkeyPatch) -> None:
    client, new = setup
    new("m", 0.5, 10)
    monkeypatch.setattr("components.tracking.registry.SETTLE_S", 0.05)
    with promotion_lock(client, "m", kind="tag", ttl_s=1.0) as handle:
        assert handle.kind == "tag" and "promotion.lock" in client.get_registered_model("m").tags
        handle.verify()
        time.sleep(1.1)
        with pytest.raises(PromotionError, match="was lost"):
            handle.verify()
    with promotion_lock(client, "m", kind="tag", ttl_s=30):
        with pytest.raises(PromotionError, match="still held"):
            with promotion_lock(client, "m", kind="tag", timeout_s=0.5):
                pass
    assert "promotion.lock" not in client.get_registered_model("m").tags
    with promotion_lock(client, "m") as handle:  # sqlite registry -> file lock
        assert handle.kind == "file"
