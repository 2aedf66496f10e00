"""The registered model is the trained multi-agent system: pyfunc load, signature, params, transcript.

A tiny random ChatML policy (components.models.tiny) is logged with recorded settings, as the
training job does, and loaded back through MLflow. Its text is gibberish; what is checked is the
shape of the answer (one transcript entry per agent and round, silent or not), the token
accounting, that the recorded protocol is the one that runs, and that request params are
honoured or rejected with a message naming them.
"""

from __future__ import annotations

import time
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from helpers.paths import load_test_module
from mlflow.exceptions import MlflowException

from components.mas.records import Episode, Message
from components.tracking import log_policy_model
from components.tracking.policy_model import INPUT_EXAMPLE
from components.tracking.served import ServedSystem, _response

test_tracking_helpers = load_test_module("test_tracking_helpers")

mlflow_uri = test_tracking_helpers.mlflow_uri  # shared pytest fixture
QUESTION = pd.DataFrame([{"question": "What is 2 + 3?"}])
INPUT_EXAMPLE_BODY = {"inputs": INPUT_EXAMPLE}


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return test_tracking_helpers.save_tiny_chat_model(tmp_path_factory.mktemp("tiny") / "policy")


@pytest.fixture()
def served(mlflow_uri: str, policy_dir: Path):
    settings = test_tracking_helpers.system_settings("mas.agents=2", "mas.rounds=2", "mas.max_message_tokens=4")
    mv = log_policy_model(policy_dir, registered_name="sys", tags={}, settings=settings, tracking_uri=mlflow_uri)
    mlflow.MlflowClient(mlflow_uri).set_registered_model_alias("sys", "champion", mv.version)
    return mlflow.pyfunc.load_model("models:/sys@champion")


def _check_accounting(answer: dict) -> None:
    t = answer["transcript"]
    assert answer["prompt_tokens"] == sum(m["prompt_tokens"] for m in t)
    assert answer["completion_tokens"] == sum(m["completion_tokens"] for m in t)
    assert answer["total_tokens"] == answer["prompt_tokens"] + answer["completion_tokens"]
    assert answer["communicated_tokens"] == sum(m["completion_tokens"] * len(m["recipients"])
                                                for m in t if not m["silent"])
    assert answer["turns"] == sum(not m["silent"] for m in t) and answer["messages"] == len(t)


@pytest.mark.slow
def test_registered_version_answers_as_the_trained_system(served) -> None:
    sig = served.metadata.signature
    assert sig.inputs.input_names() == ["question", "answer_type", "choices"]
    assert {"answer", "final_text", "transcript", "prompt_tokens", "completion_tokens", "communicated_tokens",
            "turns"} <= set(sig.outputs.input_names())
    defaults = {p.name: p.default for p in sig.params.params}
    assert defaults == {"agents": 2, "rounds": 2, "max_new_tokens": 4, "temperature": 0.0, "seed": 0}

    (answer,) = served.predict(QUESTION)
    assert set(answer) >= {"answer", "final_text", "transcript"}
    assert [(m["agent"], m["round"]) for m in answer["transcript"]] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert all(1 <= m["completion_tokens"] <= 4 for m in answer["transcript"])
    _check_accounting(answer)
    assert served.predict(QUESTION) == [answer]  # greedy by default: the same answer again

    wider = served.predict(pd.DataFrame([{"question": "Pick one", "answer_type": "choice", "choices": ["1", "2"]}]),
                           params={"agents": 3, "rounds": 1, "max_new_tokens": 2})
    assert [(m["agent"], m["round"]) for m in wider[0]["transcript"]] == [(0, 0), (1, 0), (2, 0)]
    assert all(m["completion_tokens"] <= 2 for m in wider[0]["transcript"])
    sampled = [served.predict(QUESTION, params={"temperature": 1.5, "seed": 3}) for _ in range(2)]
    assert sampled[0] == sampled[1]  # sampled, but reproducible with the same seed
    others = pd.DataFrame([{"question": "Name a colour."}, {"question": "What is 2 + 3?"}, {"question": "Hi?"}])
    batched = served.predict(others, params={"temperature": 1.5, "seed": 3})
    assert batched[1] == sampled[0][0]  # a sampled row's answer does not depend on the other rows

    for params, named in (({"agents": 0}, "agents=0"), ({"rounds": 9}, "rounds=9"),
                          ({"temperature": 5.0}, "temperature=5.0"), ({"max_new_tokens": 0}, "max_new_tokens=0")):
        with pytest.raises(MlflowException, match=named):
            served.predict(QUESTION, params=params)
    with pytest.raises(MlflowException, match="answer_type 'essay'"):
        served.predict(pd.DataFrame([{"question": "q", "answer_type": "essay"}]))
    with pytest.raises(MlflowException, match="needs 'choices'"):
        served.predict(pd.DataFrame([{"question": "q", "answer_type": "choice"}]))


@pytest.mark.slow
def test_scoring_server_refuses_bad_requests_with_400_naming_the_field(served) -> None:
    """Through MLflow's own request parsing (the app ``mlflow models serve`` runs), in-process."""
    from fastapi.testclient import TestClient
    from mlflow.pyfunc import scoring_server

    client = TestClient(scoring_server.init(served))
    q = [{"question": "What is 2 + 3?"}]
    for body, named in (({"inputs": [{"question": None}]}, "row 0: 'question' must be a non-empty string, got "),
                        ({"dataframe_records": [{"question": None}]}, "row 0: 'question' must be a non-empty string"),
                        # MLflow's string enforcement made these the texts '123', 'True', "{'a': 1}" (answered)
                        ({"inputs": [{"question": 123}]}, "row 0: 'question' must be a non-empty string, got 123"),
                        ({"dataframe_records": [{"question": True}]}, "'question' must be a non-empty string, got "
                                                                       "True"),
                        ({"inputs": [q[0], {"question": {"a": 1}}]}, "row 1: 'question' must be a non-empty string"),
                        ({"inputs": [{"question": "What is 2+3? " * 200_000}]}, "row 0: 'question' is too long: "),
                        ({"inputs": q, "params": {"max_new_tokens": 30_000}},
                         "invalid params: max_new_tokens=30000: at most "),
                        ({"inputs": q, "params": {"seed": 99999999999999999999}},
                         "invalid params: seed=99999999999999999999: must be an integer in 0..4294967295"),
                        ({"inputs": [{"question": "q", "answer_type": "choice", "choices": list("ABCDEFGHIJK")}]},
                         "row 0: 'choices' has 11 options"),
                        # MLflow's Array(string) enforcement made this ["a", "n"] before predict saw it
                        ({"inputs": [{"question": "q", "answer_type": "choice", "choices": ["a", None]}]},
                         "row 0: 'choices'[1] must be a non-empty string, got None"),
                        ({"dataframe_records": [{"question": "q", "answer_type": "choice", "choices": ["a", None]}]},
                         "row 0: 'choices'[1] must be a non-empty string, got None")):
        t0 = time.perf_counter()
        res = client.post("/invocations", json=body)
        assert res.status_code == 400 and named in res.json()["message"], (body, res.text[:500])
        assert "Traceback" not in res.text and time.perf_counter() - t0 < 10
    res = client.post("/invocations", json={"inputs": q, "params": {"seed": 2**32 - 1, "temperature": 0.5}})
    assert res.status_code == 200 and len(res.json()["predictions"][0]["transcript"]) == 4, res.text


ROWS = [{"question": "What is 2 + 3?", "answer_type": "numeric", "choices": None},
        {"question": "Pick one", "answer_type": "choice", "choices": ["1", "2", "3"]},
        {"question": "Pick again", "answer_type": "choice", "choices": ["4", "5"]}]
COLUMNS = {key: [row[key] for row in ROWS] for key in ROWS[0]}


@pytest.mark.slow
def test_scoring_server_answers_every_form_that_carries_a_question_alike(served) -> None:
    """Every MLflow request form that carries a ``question`` field gets the answers of ``dataframe_records``.

    The columnar forms were a 400 "row 0: 'question' must be a non-empty string, got [...]" (MLflow
    hands them over as one row of lists), and choices of different lengths or a null one a 400
    "inhomogeneous shape" (the ``Array`` column was packed into one numpy array)."""
    from fastapi.testclient import TestClient
    from mlflow.pyfunc import scoring_server

    client = TestClient(scoring_server.init(served))

    def post(body: dict) -> list:
        res = client.post("/invocations", json=body)
        assert res.status_code == 200, (body, res.text[:500])
        return res.json()["predictions"]

    expected = post({"dataframe_records": ROWS})
    assert [len(a["transcript"]) for a in expected] == [4, 4, 4]
    for body in ({"dataframe_split": {"columns": list(COLUMNS), "data": [list(r.values()) for r in ROWS]}},
                 {"inputs": ROWS}, {"inputs": COLUMNS}, {"instances": COLUMNS},
                 {"inputs": [{"question": ROWS[0]["question"], "answer_type": "numeric"}, *ROWS[1:]]}):  # no choices
        assert post(body) == expected, body
    assert post(INPUT_EXAMPLE_BODY)[1]["prompt_tokens"] > 0  # the saved example, as columns

    questions = [{"question": "What is 2 + 3?"}, {"question": "Name a colour."}]
    expected = post({"dataframe_records": questions})
    for body in ({"inputs": {"question": [q["question"] for q in questions]}}, {"instances": questions},
                 {"instances": {"question": [q["question"] for q in questions]}}, {"inputs": questions}):
        assert post(body) == expected, body
    assert post({"inputs": {"question": [questions[1]["question"]]}}) == expected[1:]

    for body, named in (({"inputs": {"question": ["What is 2 + 3?", 123]}},
                         "row 1: 'question' must be a non-empty string, got 123"),
                        ({"instances": [{"question": True}]}, "row 0: 'question' must be a non-empty string, got True"),
                        ({"inputs": {"question": ["q1", "q2"], "answer_type": "math"}},
                         "inputs: 'question' is a list of 2, read as columns"),
                        ({"inputs": {"question": ["q1", "q2"], "choices": ["a", "b", "c"]}},
                         "but 'choices' is a list of 3: give every field as a list of 2 values"),
                        # columns of other lengths that MLflow itself makes a frame of: its own 400
                        ({"inputs": {"question": ["q1", "q2"], "choices": [["a", "b"]]}},
                         "All arrays must be of the same length")):
        res = client.post("/invocations", json=body)
        assert res.status_code == 400 and named in res.json()["message"], (body, res.text[:500])


@pytest.mark.slow
def test_version_carries_its_settings_and_code(mlflow_uri: str, policy_dir: Path, tmp_path: Path) -> None:
    settings = test_tracking_helpers.system_settings("mas.topology=chain", "mas.agents=3")
    mv = log_policy_model(policy_dir, registered_name="chain", tags={}, settings=settings, tracking_uri=mlflow_uri)
    local = Path(mlflow.artifacts.download_artifacts(f"models:/chain/{mv.version}", dst_path=str(tmp_path)))
    stored = next(local.rglob("agent_gspo_system.json"))
    assert '"topology": "chain"' in stored.read_text()
    assert (local / "code" / "components" / "tracking" / "served.py").is_file()  # the code travels too
    assert not list(local.rglob("__pycache__"))


def test_recorded_protocol_is_the_one_that_runs(policy_dir: Path) -> None:
    """The same policy under two recorded topologies: chain delivers each message to at most one agent."""
    from components.models import load_policy

    model, tokenizer = load_policy(str(policy_dir))
    fan = {}
    for topology in ("complete", "chain"):
        settings = test_tracking_helpers.system_settings(f"mas.topology={topology}", "mas.agents=3")
        system = ServedSystem(model, tokenizer, settings)
        assert system.mas_for(None)[0].topology == topology
        (answer,) = system.answer([{"question": "What is 2 + 3?"}])
        _check_accounting(answer)
        fan[topology] = max(len(m["recipients"]) for m in answer["transcript"])
    assert fan == {"complete": 2, "chain": 1}


def test_transcript_keeps_silent_turns() -> None:
    msgs = [Message("q", 0, 0, "solver", 0, [1] * 7, [5, 6, 2], [0.0] * 3, False, [1], "The answer is 5"),
            Message("q", 0, 1, "critic", 0, [1] * 9, [9, 2], [0.0] * 2, True, [], "<silent>")]
    answer = _response(Episode("q", 0, "request", msgs, final_answer="The answer is 5"), "5")
    assert answer["answer"] == "5" and answer["final_text"] == "The answer is 5"
    assert [(m["agent"], m["silent"], m["recipients"]) for m in answer["transcript"]] == [(0, False, [1]),
                                                                                          (1, True, [])]
    _check_accounting(answer)
    assert (answer["turns"], answer["communicated_tokens"], answer["completion_tokens"]) == (1, 3, 5)
