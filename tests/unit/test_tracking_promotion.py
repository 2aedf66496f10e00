"""Promotion gate rules, tags, idempotency and concurrent promotions (sqlite:/// registry)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import test_tracking_helpers
from mlflow import MlflowClient

from components.tracking import PromotionDecision, PromotionError, promote, promotion_lock, write_eval_tags

mlflow_uri = test_tracking_helpers.mlflow_uri  # shared pytest fixture
RULE = {"accuracy_tolerance": 0.01, "max_token_ratio": 1.0, "min_accuracy": 0.5}


def _version(client: MlflowClient, tmp_path: Path, name: str, acc: float | None, tokens: float | None) -> str:
    """Register a version (no real model needed for the gate) with eval tags."""
    if not client.search_registered_models(filter_string=f"name = '{name}'"):
        client.create_registered_model(name)
    src = tmp_path / f"src-{time.monotonic_ns()}"
    src.mkdir()
    mv = client.create_model_version(name, str(src))
    if acc is not None and tokens is not None:
        write_eval_tags(client, name, mv.version, accuracy=acc, tokens_total=tokens)
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
    d = promote(client, "m", low, **RULE)
    assert d.decision == "rejected" and "0.4000 < min_accuracy 0.5000" in d.reason
    assert _alias(client, "m", "champion") is None
    assert client.get_model_version("m", low).tags["promotion.decision"] == "rejected"
    ok = new("m", 0.6, 100)
    d = promote(client, "m", ok, **RULE)
    assert d.decision == "champion" and d.compared_to is None and _alias(client, "m", "champion") == ok


def test_better_and_cheaper_is_promoted_more_expensive_is_challenger(setup) -> None:
    client, new = setup
    v1 = new("m", 0.70, 1000)
    assert promote(client, "m", v1, **RULE).decision == "champion"
    v2 = new("m", 0.695, 800)  # within tolerance, cheaper
    d = promote(client, "m", v2, **RULE)
    assert d.decision == "champion" and d.compared_to == v1
    assert _alias(client, "m", "champion") == v2
    assert client.get_model_version("m", v1).tags["promotion.superseded_by"] == v2

    v3 = new("m", 0.90, 900)  # far more accurate but more tokens than the champion (800)
    d = promote(client, "m", v3, **RULE)
    assert isinstance(d, PromotionDecision) and d.decision == "challenger"
    assert "tokens 900.0 > champion 800.0" in d.reason and "accuracy" not in d.reason
    assert _alias(client, "m", "champion") == v2 and _alias(client, "m", "challenger") == v3
    tags = client.get_model_version("m", v3).tags
    assert tags["promotion.decision"] == "challenger" and tags["promotion.compared_to"] == v2
    assert tags["promotion.reason"] == d.reason and float(tags["promotion.champion_tokens_total"]) == 800
    assert d.metrics_used["candidate_accuracy"] == 0.9 and d.metrics_used["champion_accuracy"] == 0.695

    v4 = new("m", 0.60, 500)  # cheaper but loses accuracy beyond the tolerance
    d = promote(client, "m", v4, **RULE)
    assert d.decision == "challenger" and "accuracy 0.6000 < champion" in d.reason


def test_passed_metrics_and_champion_metrics_fn_override_tags(setup) -> None:
    client, new = setup
    v1 = new("m", 0.8, 100)
    promote(client, "m", v1, **RULE)
    v2 = new("m", None, None)
    with pytest.raises(PromotionError, match="eval.accuracy"):
        promote(client, "m", v2, **RULE)
    seen = []
    d = promote(client, "m", v2, {"accuracy": 0.5, "eval.tokens_total": 50}, **RULE,
                champion_metrics_fn=lambda v: seen.append(v) or {"accuracy": 0.5, "tokens_total": 60})
    assert seen == [v1] and d.decision == "champion"
    with pytest.raises(PromotionError, match="does not exist"):
        promote(client, "m", "99", **RULE)


def test_rerun_is_idempotent(setup) -> None:
    client, new = setup
    v1, v2 = new("m", 0.8, 100), new("m", 0.8, 200)
    promote(client, "m", v1, **RULE)
    first = promote(client, "m", v2, **RULE)
    assert first.decision == "challenger"
    before = client.get_model_version("m", v2).tags
    again = promote(client, "m", v2, **RULE)
    assert again.decision == "unchanged" and "already challenger" in again.reason
    assert client.get_model_version("m", v2).tags == before  # nothing rewritten (decided_at too)
    assert promote(client, "m", v1, **RULE).decision == "unchanged"
    assert _alias(client, "m", "champion") == v1 and _alias(client, "m", "challenger") == v2
    # once the champion changes, the same candidate is decided again
    write_eval_tags(client, "m", v1, accuracy=0.8, tokens_total=300)
    assert promote(client, "m", v2, **RULE).decision == "champion"
    assert _alias(client, "m", "challenger") is None


def _race(client_uri: str, name: str, versions: list[str], lock: str,
          champion_metrics_fn: Callable[[str], dict]) -> tuple[list[PromotionDecision], list[BaseException]]:
    results: list[PromotionDecision] = []
    errors: list[BaseException] = []

    def worker(version: str) -> None:
        try:
            results.append(promote(MlflowClient(client_uri), name, version, **RULE, lock=lock,
                                   champion_metrics_fn=champion_metrics_fn))
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
    promote(client, "m", v1, **RULE)
    v2, v3 = new("m", 0.8, 900), new("m", 0.8, 850)  # both beat v1; v3 also beats v2

    def slow_champion(version: str) -> dict:  # widens the read-decide-write window
        time.sleep(0.3)
        mv = client.get_model_version("m", version)
        return {"accuracy": mv.tags["eval.accuracy"], "tokens_total": mv.tags["eval.tokens_total"]}

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
    promote(client, "m", v1, **RULE)
    v2, v3 = new("m", 0.8, 900), new("m", 0.8, 850)
    barrier = threading.Barrier(2, timeout=20)
    results, errors = _race(mlflow_uri, "m", [v2, v3], "none",
                            lambda v: barrier.wait() * 0 or {"accuracy": 0.7, "tokens_total": 1000})
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
