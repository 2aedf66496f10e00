"""Signed evidence: a record made without the signing key is refused by name, whoever can write to MLflow.

Was (docs/gate.md, "What any client with write access can still do", until 2026-12-07): the gate
verified that a record was not changed after its run logged it, not who made the run. With plain
``MlflowClient`` calls (``create_run``, ``log_batch`` of the four params, ``log_artifact``, the
version's four ``eval.<key>.*`` tags) anyone with write access crowned a record with every answer
correct (``decision: champion - better``); a ``params.decision = champion`` run in the decision log
set the bar once ``@champion`` was deleted. Each test below failed that way on the old code.
"""

from __future__ import annotations

import os
import secrets
import stat
import time
from pathlib import Path

import pytest
from helpers import gate_helpers as gh
from helpers.paths import load_test_module
from mlflow import MlflowClient
from mlflow.entities import Param

from components.config_sections import SigningConfig
from components.errors import UserError
from components.tracking import ChampionNotEvaluated, Trust, UntrustedRecord, load_key
from components.tracking.decision_log import experiment_name
from components.tracking.signing import EVAL_SIGNATURE_PARAM, KEY_ENV, SigningKey, default_key_path

test_tracking_helpers = load_test_module("test_tracking_helpers")
test_tracking_promotion = load_test_module("test_tracking_promotion")
mlflow_uri = test_tracking_helpers.mlflow_uri  # shared pytest fixtures
setup = test_tracking_promotion.setup
promote, _alias, KEY = test_tracking_promotion.promote, test_tracking_promotion._alias, gh.KEY


def forge_plain(client: MlflowClient, name: str, version: str) -> str:
    """docs/gate.md's recipe (:func:`gate_helpers.forge`: MLflow's client, hashlib and json, nothing of
    this project): a run claiming all of 60 gsm8k items correct, and the version's four tags."""
    return gh.forge(client, Path.cwd(), name, version, gh.records([True] * 60, 100))


def test_a_fabricated_evaluation_is_refused_naming_the_version_and_run(setup) -> None:
    client, new = setup
    v1 = new("m", 0.5, 6000)
    assert promote(client, "m", v1).decision == "champion"
    v2 = gh.register(client, Path.cwd(), "m")
    run = forge_plain(client, "m", v2)  # the old code: "champion - better"
    with pytest.raises(UntrustedRecord, match=rf"^candidate models:/m/{v2}: evaluation run {run} refused, unsigned: "):
        promote(client, "m", v2)
    assert _alias(client, "m", "champion") == v1 and "promotion.decision" not in client.get_model_version("m", v2).tags
    first = gh.register(client, Path.cwd(), "n")  # a first model (nothing to compare with) is refused too
    forge_plain(client, "n", first)
    with pytest.raises(UntrustedRecord, match=rf"^candidate models:/n/{first}: evaluation run \w+ refused, unsigned"):
        promote(client, "n", first)
    assert _alias(client, "n", "champion") is None


def test_a_signature_copied_from_a_genuine_run_does_not_verify(setup) -> None:
    client, new = setup
    v1 = new("m", 0.5, 6000)
    promote(client, "m", v1)
    genuine = client.get_run(client.get_model_version("m", v1).tags[f"eval.{KEY}.run_id"]).data.params
    v2 = gh.register(client, Path.cwd(), "m")
    run = forge_plain(client, "m", v2)
    client.log_param(run, EVAL_SIGNATURE_PARAM, genuine[EVAL_SIGNATURE_PARAM])  # the run id differs: no match
    with pytest.raises(UntrustedRecord, match=rf"candidate models:/m/{v2}: evaluation run {run} refused, signature "
                       r"does not match: the run's params differ from what was signed \(a copied or forged"):
        promote(client, "m", v2)
    v3 = gh.register(client, Path.cwd(), "m")  # signed under another key: named by its key id
    run = forge_plain(client, "m", v3)
    client.log_param(run, EVAL_SIGNATURE_PARAM, "v1:0123456789ab:" + "0" * 64)
    with pytest.raises(UntrustedRecord, match=r"signature does not match: signed under key 0123456789ab, the key "
                       r"here \(.*mlflow.db.signing-key\) is [0-9a-f]{12}"):
        promote(client, "m", v3)
    assert _alias(client, "m", "champion") == v1


def test_a_genuine_record_without_the_key_here_or_under_another_key_is_refused(setup) -> None:
    client, new = setup
    v1 = new("m", 0.5, 6000)
    other = Trust(SigningKey(secrets.token_hex(32).encode(), "another key"))
    with pytest.raises(UntrustedRecord, match=r"signature does not match: signed under key \w+, the key here "
                       r"\(another key\)"):
        promote(client, "m", v1, trust=other)
    with pytest.raises(UntrustedRecord, match="signature does not match: signed under key \\w+, but no signing key"):
        promote(client, "m", v1, trust=Trust())


def test_a_forged_crowning_in_the_decision_log_sets_no_bar(setup, caplog: pytest.LogCaptureFixture) -> None:
    """v1 (0.8) is the champion, weak (0.2) its challenger; a forged ``decision = champion`` run names weak
    and the alias is deleted. The old code paired the next candidate (0.5) with weak and crowned it."""
    client, new = setup
    v1 = new("m", 0.8, 6000)
    promote(client, "m", v1)
    weak = new("m", 0.2, 6000)
    assert promote(client, "m", weak).decision == "challenger"
    exp = client.get_experiment_by_name(experiment_name("m")).experiment_id
    genuine = client.search_runs([exp], filter_string="params.decision = 'champion'")[0].data.params
    for copied in (None, genuine["signature"]):  # unsigned, then with a genuine crowning's signature copied
        forged = client.create_run(exp, start_time=int(time.time() * 1000) + 60_000).info.run_id  # the newest
        params = dict(genuine) | {"version": weak, "eval_run_id": client.get_model_version("m", weak).tags[
            f"eval.{KEY}.run_id"]}
        params.pop("signature")
        client.log_batch(forged, params=[Param(k, v) for k, v in (params | ({"signature": copied} if copied
                                                                          else {})).items()])
    client.delete_registered_model_alias("m", "champion")
    cand = new("m", 0.5, 6000)
    with caplog.at_level("WARNING"):
        d = promote(client, "m", cand)
    assert d.decision == "challenger" and d.compared_to == v1 and d.verdict.outcome == "worse"
    assert _alias(client, "m", "champion") is None
    ignored = [r.getMessage() for r in caplog.records if "is not trusted, ignored" in r.getMessage()]
    assert len(ignored) == 2 and any(": unsigned" in m for m in ignored), ignored
    assert any("signature does not match: the run's params differ" in m for m in ignored), ignored


def test_accept_unsigned_takes_unsigned_records_only_and_says_so(setup, caplog: pytest.LogCaptureFixture) -> None:
    """The opt-out for registries made before signing: an unsigned record passes with a warning naming
    it; a signature that does not match is refused all the same."""
    client, new = setup
    legacy = Trust(gh.trust(client).key, accept_unsigned=True)
    v1 = gh.register(client, Path.cwd(), "m")
    run = gh.forge(client, Path.cwd(), "m", v1, gh.records([True] * 30 + [False] * 30, 100))
    with caplog.at_level("WARNING"):
        assert promote(client, "m", v1, trust=legacy).decision == "champion"
    assert f"candidate models:/m/{v1}: evaluation run {run} is unsigned; accepted because registry.signing." \
           "accept_unsigned is true" in caplog.text
    v2 = gh.register(client, Path.cwd(), "m")
    bad = gh.forge(client, Path.cwd(), "m", v2, gh.records([True] * 60, 100))
    client.log_param(bad, EVAL_SIGNATURE_PARAM, client.get_run(gh.evaluate(
        client, Path.cwd(), "m", v1, gh.records([True] * 30 + [False] * 30, 100))).data.params[EVAL_SIGNATURE_PARAM])
    with pytest.raises(UntrustedRecord, match="signature does not match"):
        promote(client, "m", v2, trust=legacy)


def test_an_unsigned_champion_record_asks_for_a_new_evaluation(setup) -> None:
    """A champion evaluated before records were signed (or whose record was replaced by a forgery) is
    like one never evaluated: ``promote --evaluate-champion`` measures it again, signed."""
    client, new = setup
    v1 = gh.register(client, Path.cwd(), "m")
    gh.forge(client, Path.cwd(), "m", v1, gh.records([True] * 30 + [False] * 30, 100))
    client.set_registered_model_alias("m", "champion", v1)
    v2 = new("m", 0.9, 6000)
    with pytest.raises(ChampionNotEvaluated, match=rf"champion models:/m/{v1}: evaluation run \w+ refused, "
                       r"unsigned: .* or run `agent-gspo promote --evaluate-champion`") as exc:
        promote(client, "m", v2)
    assert exc.value.champion == v1


def test_the_key_is_generated_once_private_beside_a_sqlite_registry(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    uri = f"sqlite:///{tmp_path / 'reg' / 'mlflow.db'}"
    assert load_key(SigningConfig(), uri, create=False) is None
    key = load_key(SigningConfig(), uri, create=True)
    path = tmp_path / "reg" / "mlflow.db.signing-key"
    assert default_key_path(uri) == path and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().strip().encode() == key.secret and len(key.secret) == 64
    assert load_key(SigningConfig(), uri, create=True) == key  # once: never replaced
    assert key.secret.decode() not in repr(key) and key.key_id in repr(SigningKey(key.secret, key.key_id))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))  # a server: the user's own key
    assert default_key_path("http://mlflow.example:5000") == tmp_path / "cfg" / "agent-gspo" / "signing-key"


def test_the_environment_then_the_key_file_then_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    shared = tmp_path / "team.key"
    shared.write_text("k" * 40 + "\n")
    os.chmod(shared, 0o644)
    with caplog.at_level("WARNING"):
        from_file = load_key(SigningConfig(key_file=str(shared)), uri, create=True)
    assert from_file.secret == b"k" * 40 and "can be read by other users (mode 644): chmod 600 it" in caplog.text
    monkeypatch.setenv(KEY_ENV, "e" * 32)
    assert load_key(SigningConfig(key_file=str(shared)), uri, create=True).secret == b"e" * 32
    assert not (tmp_path / "mlflow.db.signing-key").exists()
    monkeypatch.setenv(KEY_ENV, "tooShortSecret")
    with pytest.raises(UserError, match=rf"signing key from \${KEY_ENV} has 14 characters; it needs at least 32") as e:
        load_key(SigningConfig(), uri, create=True)
    assert "tooShortSecret" not in str(e.value)
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(UserError, match=r"signing key registry.signing.key_file .*nope.key: cannot be read"):
        load_key(SigningConfig(key_file=str(tmp_path / "nope.key")), uri, create=True)
