"""What MLflow's scoring server (``mlflow models serve``) answers before and after the project's code
runs, as docs/data.md states it: the raw body is parsed by MLflow, so a JSON body nested deeper than
Python's recursion limit allows (~985 levels) is a 500 the project cannot intercept; malformed JSON,
bad UTF-8 and everything the model's ``predict`` refuses are 400. If an MLflow upgrade changes any of
this, this test fails and docs/data.md must be updated. (FastAPI's test client: no socket.)"""

from __future__ import annotations

import json

import mlflow
import pytest
from mlflow.pyfunc import PythonModel

pytestmark = pytest.mark.slow  # mlflow import + saving a model: ~30 s on 2 shared cores


class _Refusing(PythonModel):
    """Refuses what the project's checks refuse (a RequestError becomes MlflowException 400), and
    anything else it raises, as the served system's code would."""

    def predict(self, context, model_input, params=None):
        question = model_input.to_dict("records")[0].get("question")
        if not isinstance(question, str):
            raise mlflow.exceptions.MlflowException.invalid_parameter_value("row 0: 'question' must be a string")
        if question == "boom":
            raise RecursionError("inside predict")
        return [question]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from fastapi.testclient import TestClient
    from mlflow.pyfunc import scoring_server

    path = tmp_path_factory.mktemp("m") / "model"
    mlflow.pyfunc.save_model(str(path), python_model=_Refusing())
    return TestClient(scoring_server.init(mlflow.pyfunc.load_model(str(path))), raise_server_exceptions=False)


def _post(client, body: bytes):
    return client.post("/invocations", content=body, headers={"content-type": "application/json"})


def _nested(depth: int) -> bytes:
    return b'{"dataframe_records": [{"question": ' + b"[" * depth + b"]" * depth + b"}]}"


def test_mlflow_parses_the_body_first(client) -> None:
    deep = _post(client, _nested(100_000))
    assert deep.status_code == 500 and deep.text == "Internal Server Error"  # RecursionError in MLflow's json.loads
    assert _post(client, _nested(900)).status_code == 400  # parsed: the model's check refuses it
    assert _post(client, b'{"dataframe_records": [1,').status_code == 400  # malformed JSON
    assert _post(client, b'{"dataframe_records": [{"question": "\xff"}]}').status_code == 400  # not UTF-8
    assert _post(client, json.dumps({"dataframe_records": [{"question": "boom"}]}).encode()).status_code == 400
    ok = _post(client, json.dumps({"dataframe_records": [{"question": "hi"}]}).encode())
    assert ok.status_code == 200 and ok.json() == {"predictions": ["hi"]}
