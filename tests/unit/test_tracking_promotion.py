"""Promotion gate: rules, like-with-like settings, lineage reference, tags, idempotency, concurrency (sqlite:///)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import test_tracking_helpers
from mlflow import MlflowClient

from components.tracking import (
    CandidateNotEvaluated,
    ChampionNotEvaluated,
    GateResult,
    GateRule,
    PromotionDecision,
    PromotionError,
    promotion_lock,
    read_result,
    write_result,
)
from components.tracking import promote as _promote

mlflow_uri = test_tracking_helpers.mlflow_uri  # shared pytest fixture
RULE = GateRule(accuracy_tolerance=0.01, max_token_ratio=1.0, min_accuracy=0.5)
KEY = "gatesetting1"  # the gate's setting in these tests; results under other keys must not count


def promote(client: MlflowClient, name: str, version: str, **kw) -> PromotionDecision:
    return _promote(client, name, version, setting_key=kw.pop("setting_key", KEY), rule=kw.pop("rule", RULE), **kw)


def evaluate(client: MlflowClient, name: str, version: str, acc: float, tokens: float, key: str = KEY) -> None:
    write_result(client, name, version, key, {"benchmarks": ["gsm8k"], "limit": 1}, GateResult(acc, tokens, 7, "run"))


def _version(client: MlflowClient, tmp_path: Path, name: str, acc: float | None, tokens: float | None) -> str:
    """Register a version (no real model needed for the gate) with results under the gate's setting."""
    if not client.search_registered_models(filter_string=f"name = '{name}'"):
        client.create_registered_model(name)
    src = tmp_path / f"src-{time.monotonic_ns()}"
    src.mkdir()
    mv = client.create_model_version(name, str(src))
    if acc is not None and tokens is not None:
        evaluate(client, name, str(mv.version), acc, tokens)
    return str(mv.version)


def _alias(client: MlflowClient, name: str, alias: str) -> str | None:
    aliases = client.get_registered_model(name).aliases
    return str(aliases[alias]) if alias in aliases else None


@pytest.fixture()
def setup(mlflow_uri: str, tmp_path: Path) -> tuple[MlflowClient, Callable[..., str]]:
    client = MlflowClient(mlflow_uri)
    return client, lambda name, acc, tok: _version(client, tmp_path, name, acc, tok)


def test_first_model_needs_min_accuracy(setup) -> None:
    client, new = setup
    low = new("m", 0.4, 100)
    d = promote(client, "m", low)
    assert d.decision == "rejected" and "0.4000 < min_accuracy 0.5000" in d.reason
    assert _alias(client, "m", "champion") is None
    assert client.get_model_version("m", low).tags["promotion.decision"] == "rejected"
    ok = new("m", 0.6, 100)
    d = promote(client, "m", ok)
    assert d.decision == "champion" and d.compared_to is None and _alias(client, "m", "champion") == ok
    assert client.get_model_version("m", ok).tags["promotion.setting"] == KEY


def test_better_and_cheaper_is_promoted_more_expensive_is_challenger(setup) -> None:
    client, new = setup
    v1 = new("m", 0.70, 1000)
    assert promote(client, "m", v1).decision == "champion"
    v2 = new("m", 0.695, 800)  # within tolerance, cheaper
    d = promote(client, "m", v2)
    assert d.decision == "champion" and d.compared_to == v1
    assert _alias(client, "m", "champion") == v2
    assert client.get_model_version("m", v1).tags["promotion.superseded_by"] == v2

    v3 = new("m", 0.90, 900)  # far more accurate but more tokens than the champion (800)
    d = promote(client, "m", v3)
    assert d.decision == "challenger"
    assert "tokens 900.0 > champion 800.0" in d.reason and "accuracy" not in d.reason
    assert _alias(client, "m", "champion") == v2 and _alias(client, "m", "challenger") == v3
    tags = client.get_model_version("m", v3).tags
    assert tags["promotion.decision"] == "challenger" and tags["promotion.compared_to"] == v2
    assert tags["promotion.reason"] == d.reason and float(tags["promotion.bar_tokens_total"]) == 800
    assert d.metrics_used["candidate_accuracy"] == 0.9

    v4 = new("m", 0.60, 500)  # cheaper but loses accuracy beyond the tolerance
    d = promote(client, "m", v4)
    assert d.decision == "challenger" and "accuracy 0.6000 < champion" in d.reason


def test_only_results_under_the_gates_setting_count(setup) -> None:
    """A candidate evaluated on 5 items (another setting) cannot beat a champion evaluated on all of them."""
    client, new = setup
    v1 = new("m", 0.60, 1000)
    promote(client, "m", v1)
    v2 = new("m", None, None)
    evaluate(client, "m", v2, 1.0, 10, key="fiveitems000")
    with pytest.raises(CandidateNotEvaluated, match="has no evaluation under the gate's setting gatesetting1.*"
                                                    "it has: fiveitems000"):
        promote(client, "m", v2)
    assert _alias(client, "m", "champion") == v1

    # the champion measured only under another setting: refuse to compare rather than mix settings
    with pytest.raises(ChampionNotEvaluated, match=f"champion models:/m/{v1} has no evaluation") as err:
        promote(client, "m", v2, setting_key="fiveitems000")
    assert err.value.champion == v1
    evaluate(client, "m", v1, 0.55, 900, key="fiveitems000")
    assert promote(client, "m", v2, setting_key="fiveitems000").decision == "champion"


def test_a_partial_evaluation_never_overwrites_the_gates_inputs(setup) -> None:
    client, new = setup
    v1 = new("m", 0.143, 10814)
    evaluate(client, "m", v1, 0.0, 1611, key="onebenchmark")  # e.g. the evaluate deployment on one benchmark
    tags = client.get_model_version("m", v1).tags
    assert read_result(tags, KEY, "v1") == GateResult(0.143, 10814.0, 7, "run")
    assert read_result(tags, "onebenchmark", "v1").tokens_total == 1611
    assert tags["eval.latest_setting"] == "onebenchmark"


def test_missing_champion_does_not_lower_the_bar(setup) -> None:
    client, new = setup
    v1 = new("m", 0.80, 1000)
    assert promote(client, "m", v1).decision == "champion"
    client.delete_registered_model_alias("m", "champion")  # or the version is deleted: same path
    v2 = new("m", 0.60, 500)  # would pass min_accuracy 0.5 as a "first model"
    d = promote(client, "m", v2)
    assert d.decision == "challenger" and d.compared_to == "reference"
    assert "accuracy 0.6000 < lineage reference 0.8000 (v1)" in d.reason
    client.delete_model_version("m", v1)
    v3 = new("m", 0.795, 900)
    d = promote(client, "m", v3)
    assert d.decision == "champion" and d.compared_to == "reference" and _alias(client, "m", "champion") == v3

    # no champion and nothing measured under a new setting: refuse instead of falling back to min_accuracy
    client.delete_registered_model_alias("m", "champion")
    v4 = new("m", None, None)
    evaluate(client, "m", v4, 0.9, 10, key="newsetting00")
    with pytest.raises(PromotionError, match=f"no @champion \\(v{v3} was the last one"):
        promote(client, "m", v4, setting_key="newsetting00")


def test_small_drops_cannot_ratchet_accuracy_down(setup) -> None:
    client, new = setup
    v1 = new("m", 0.500, 1000)
    promote(client, "m", v1)
    v2 = new("m", 0.495, 900)  # within 0.01 of 0.500 and cheaper: promoted
    assert promote(client, "m", v2).decision == "champion"
    v3 = new("m", 0.489, 800)  # within 0.01 of the champion (0.495), not of the lineage's best (0.500)
    d = promote(client, "m", v3)
    assert d.decision == "challenger" and "< champion 0.5000 (v1)" in d.reason
    assert _alias(client, "m", "champion") == v2
    model_tags = client.get_registered_model("m").tags
    assert float(model_tags[f"gate.{KEY}.best_accuracy"]) == 0.5 and model_tags[f"gate.{KEY}.min_tokens_version"] == v2
    loose = GateRule(accuracy_tolerance=0.01, max_token_ratio=1.2, min_accuracy=0.5)  # tokens cannot creep up either
    v4 = new("m", 0.50, 1050)  # <= 1.2 x 900 (champion v2, also the lineage's fewest)
    assert promote(client, "m", v4, rule=loose).decision == "champion"
    v5 = new("m", 0.50, 1250)  # <= 1.2 x 1050 (the new champion v4), > 1.2 x 900 (the lineage's fewest)
    d = promote(client, "m", v5, rule=loose)
    assert d.decision == "challenger" and "> champion 900.0" in d.reason


def test_rerun_is_idempotent(setup) -> None:
    client, new = setup
    v1, v2 = new("m", 0.8, 100), new("m", 0.8, 200)
    promote(client, "m", v1)
    first = promote(client, "m", v2)
    assert first.decision == "challenger"
    before = client.get_model_version("m", v2).tags
    again = promote(client, "m", v2)
    assert again.decision == "unchanged" and "already challenger" in again.reason
    assert client.get_model_version("m", v2).tags == before  # nothing rewritten (decided_at too)
    assert promote(client, "m", v1).decision == "unchanged"
    assert _alias(client, "m", "champion") == v1 and _alias(client, "m", "challenger") == v2
    with pytest.raises(PromotionError, match="does not exist"):
        promote(client, "m", "99")


def _race(client_uri: str, name: str, versions: list[str], lock: str,
          champion_result_fn: Callable[[str], GateResult]) -> tuple[list[PromotionDecision], list[BaseException]]:
    results: list[PromotionDecision] = []
    errors: list[BaseException] = []

    def worker(version: str) -> None:
        try:
            results.append(promote(MlflowClient(client_uri), name, version, lock=lock,
                                   champion_result_fn=champion_result_fn))
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(v,)) for v in versions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results, errors


@pytest.mark.parametrize("lock", ["file", "tag"])
def test_concurrent_promotions_serialise(mlflow_uri: str, setup, lock: str) -> None:
    client, new = setup
    v1 = new("m", 0.7, 1000)
    promote(client, "m", v1)
    v2, v3 = new("m", 0.8, 900), new("m", 0.8, 850)  # both beat v1; v3 also beats v2

    def slow_champion(version: str) -> GateResult:  # widens the read-decide-write window
        time.sleep(0.3)
        return read_result(client.get_model_version("m", version).tags, KEY, version)

    results, errors = _race(mlflow_uri, "m", [v2, v3], lock, slow_champion)
    assert not errors, errors
    first, second = sorted(results, key=lambda d: d.compared_to != v1)
    assert first.compared_to == v1 and first.decision == "champion"
    assert second.compared_to == first.version  # the second saw the first one's result
    assert _alias(client, "m", "champion") == v3  # the same outcome as a sequential run
    assert "promotion.lock" not in client.get_registered_model("m").tags


def test_without_lock_the_race_is_real(mlflow_uri: str, setup) -> None:
    """Negative control: both read champion v1 before either writes, so the lock test can fail."""
    client, new = setup
    v1 = new("m", 0.7, 1000)
    promote(client, "m", v1)
    v2, v3 = new("m", 0.8, 900), new("m", 0.8, 850)
    barrier = threading.Barrier(2, timeout=20)
    results, errors = _race(mlflow_uri, "m", [v2, v3], "none",
                            lambda v: barrier.wait() * 0 or GateResult(0.7, 1000))
    # both decided against the stale champion v1 (or collided writing the same tag)
    assert all(d.compared_to == v1 for d in results) and len(results) + len(errors) == 2


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
