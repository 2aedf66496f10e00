"""A password or token planted in a URI never reaches params, tags, messages, logs or results."""
import traceback
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT
from mlflow.exceptions import MlflowException

from components.config import load_config
from components.errors import UserError
from components.redact import redact, redact_value
from components.search.storage import redact as redact_storage
from components.tracking.backend import check_reachable, guarded
from components.tracking.errors import TrackingError

SECRET = "S3cr/et@:pw"  # '/', '@' and ':' inside the password, unencoded as users paste them
STORAGE = f"postgresql+psycopg://agent:{SECRET}@db.invalid:5432/optuna"
PARAMS = REPO_ROOT / "params.yaml"


@pytest.mark.parametrize("text, expected", [
    (STORAGE, "postgresql+psycopg://agent:***@db.invalid:5432/optuna"),
    ("http://u:pw@127.0.0.1:5000", "http://u:***@127.0.0.1:5000"),
    ("see http://bob:a/b@c@h:1/api?x=1, then", "see http://bob:***@h:1/api?x=1, then"),
    ("'https://h/x?token=abc&y=1'", "'https://h/x?token=***&y=1'"),
    ("https://h/x?api_key=k1;sig=s2", "https://h/x?api_key=***;sig=***"),
    ("--set search.storage=" + STORAGE + " --set gspo.steps=2",
     "--set search.storage=postgresql+psycopg://agent:***@db.invalid:5432/optuna --set gspo.steps=2"),
    ("sqlite:///mlflow.db", "sqlite:///mlflow.db"),
    ("postgresql+psycopg://agent@db/optuna", "postgresql+psycopg://agent@db/optuna"),
    ("file:///tmp/a@b", "file:///tmp/a@b"),
    ("models:/agent-gspo-policy@champion", "models:/agent-gspo-policy@champion"),
    ("no uri here", "no uri here"),
])
def test_redact(text: str, expected: str) -> None:
    assert redact(text) == expected
    assert redact_storage(text) == expected


def test_redact_value_walks_containers() -> None:
    out = redact_value({"a": [STORAGE, ("x", STORAGE)], "b": 3})
    assert SECRET not in repr(out) and out["b"] == 3 and isinstance(out["a"][1], tuple)


def test_flattened_config_and_hash() -> None:
    cfg = load_config(PARAMS, overrides=[f"search.storage={STORAGE}", f"tracking.uri=http://u:{SECRET}@h:5000"])
    flat = cfg.flat()
    assert SECRET not in repr(flat)
    assert flat["search.storage"] == "postgresql+psycopg://agent:***@db.invalid:5432/optuna"
    assert cfg.search.storage == STORAGE  # the run itself still gets the real value


def test_user_errors_and_tracking_errors_carry_no_password() -> None:
    assert SECRET not in str(UserError(f"cannot open {STORAGE}"))
    uri = f"http://agent:{SECRET}@127.0.0.1:9"

    def boom() -> None:
        raise MlflowException(f"API request to {uri}/api/2.0/mlflow/runs/create failed")

    with pytest.raises(TrackingError) as info:
        guarded(uri, "start run", boom)
    text = "".join(traceback.format_exception(info.value))
    assert SECRET not in text and "agent:***@127.0.0.1:9" in text
    with pytest.raises(TrackingError) as info:
        check_reachable(uri, timeout_s=2)  # nothing listens on port 9
    text = "".join(traceback.format_exception(info.value))
    assert SECRET not in text and "unreachable" in text


def test_mlflow_params_and_tags(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from components.tracking import Tracker

    cfg = load_config(PARAMS, overrides=[f"search.storage={STORAGE}", f"tracking.uri=sqlite:///{tmp_path}/m.db"])
    with Tracker(cfg.tracking.uri, "redact", "run", {"where": STORAGE}) as t:
        t.log_params(cfg.flat())
        t.log_params({"raw": STORAGE})  # even a caller that forgot to redact
        t.set_tags({"storage": STORAGE})
        run_id = t.run_id
    run = MlflowClient(cfg.tracking.uri).get_run(run_id)
    assert SECRET not in repr(run.data.params) + repr(run.data.tags)
    assert run.data.params["search.storage"].startswith("postgresql+psycopg://agent:***@")


def test_recorded_overrides_and_launch_line(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import components.runtime.launch as launch
    from experiments.runner import _recordable

    assert _recordable(f"search.storage={STORAGE}") == "search.storage=postgresql+psycopg://agent:***@db.invalid:5432/optuna"
    assert _recordable("tracking.uri=http://x:y@h") == "tracking.uri=<not recorded>"
    cfg = load_config(PARAMS, overrides=["deepspeed.launcher=torchrun", "deepspeed.nproc_per_node=1"])
    seen: list = []
    monkeypatch.setattr(launch, "run_streaming", lambda cmd, **kw: seen.append(cmd) or 0)
    assert launch.launch_training(cfg, ["--set", f"search.storage={STORAGE}", "--no-track"]) == 0
    err = capsys.readouterr().err
    assert "launching:" in err and SECRET not in err and "agent:***@" in err
    assert any(SECRET in part for part in seen[0])  # the ranks themselves still get the real value
