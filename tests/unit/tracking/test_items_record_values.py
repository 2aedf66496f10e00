"""A per-item record's values are checked, not coerced, wherever it is read (the gate, ``score``).

Was: ``bool(row["correct"])`` counted a ``correct`` of ``"false"`` as a right answer, so an
evaluation run holding such a record (its sha256 logged as the param, as any client can) was
crowned ``better`` over a champion with the same answers; a ``tokens`` of ``null`` was a TypeError
traceback (exit 1) in ``promote`` instead of one line and exit 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import gate_helpers as gh
from helpers.paths import load_test_module
from mlflow import MlflowClient
from mlflow.entities import Param

from components.comparison import ComparisonRule
from components.errors import UserError
from components.items_file import ITEMS_PARAM, ItemsFileError, decode, encode, items_sha256, read_items
from components.tracking import GateRule
from components.tracking.signing import EVAL_SIGNATURE_PARAM

test_tracking_helpers = load_test_module("test_tracking_helpers")
test_tracking_promotion = load_test_module("test_tracking_promotion")
mlflow_uri = test_tracking_helpers.mlflow_uri  # shared pytest fixture
promote, _alias = test_tracking_promotion.promote, test_tracking_promotion._alias


@pytest.mark.parametrize(("change", "message"), [
    ({"correct": "false"}, r"line 1: field 'correct' is 'false' \(str\), not true or false"),
    ({"correct": 1}, r"field 'correct' is 1 \(int\), not true or false"),
    ({"tokens": None}, r"field 'tokens' is None \(NoneType\), not \{\"total\""),
    ({"tokens": {"total": "12"}}, r"field 'tokens' is \{'total': '12'\} \(dict\)"),
    ({"tokens": {"total": float("nan")}}, r"field 'tokens' is \{'total': nan\} \(dict\)"),
    ({"tokens": {"total": -5}}, r"field 'tokens' is \{'total': -5\} \(dict\)"),
    ({"tokens": {"total": True}}, r"field 'tokens' is \{'total': True\} \(dict\)"),
    ({"id": 3}, r"field 'id' is 3 \(int\), not a string"),
    ({"system": None}, r"field 'system' is None \(NoneType\), not a string"),
])
def test_a_value_of_the_wrong_kind_is_a_one_line_error(change: dict, message: str) -> None:
    rows = [row | change for row in gh.records([False, True], 100)]
    with pytest.raises(ItemsFileError, match=message) as err:
        decode(encode(rows), "items.jsonl")
    assert isinstance(err.value, UserError) and "\n" not in str(err.value)


def test_what_evaluate_writes_still_reads_back(tmp_path: Path) -> None:
    rows = gh.records([False, True, True], [10, 20.0, 0])
    (tmp_path / "items.jsonl").write_bytes(encode(rows))
    assert read_items(tmp_path / "items.jsonl") == rows


def test_deeply_nested_json_is_a_one_line_error() -> None:
    with pytest.raises(ItemsFileError, match="line 1: JSON nested too deeply"):
        decode(b"[" * 100_000 + b"]" * 100_000 + b"\n", "items.jsonl")


@pytest.mark.parametrize("change", [{"correct": "false"}, {"tokens": None}])
def test_the_gate_refuses_a_record_with_values_of_the_wrong_kind(mlflow_uri: str, tmp_path: Path,
                                                                change: dict) -> None:
    client = MlflowClient(mlflow_uri)
    first = GateRule(ComparisonRule(min_items=20), min_accuracy=0.0)
    v1 = gh.register(client, tmp_path, "m")
    gh.evaluate(client, tmp_path, "m", v1, gh.records([False] * 60, 100))
    assert promote(client, "m", v1, rule=first).decision == "champion"
    v2 = gh.register(client, tmp_path, "m")
    rows = [row | change for row in gh.records([False] * 60, 100)]
    if "correct" in change:
        gh.evaluate(client, tmp_path, "m", v2, rows)  # its tags say accuracy 1.0, as bool("false") read it
    else:  # the version's tags from a good record, its run_id pointed at a run holding ``rows``
        good = gh.evaluate(client, tmp_path, "m", v2, gh.records([False] * 60, 100))
        client.set_model_version_tag("m", v2, f"eval.{gh.KEY}.run_id", _run_holding(client, tmp_path, good, rows))
    with pytest.raises(ItemsFileError, match="field '(correct|tokens)' is"):
        promote(client, "m", v2, rule=first)
    assert _alias(client, "m", "champion") == v1


def _run_holding(client: MlflowClient, tmp_path: Path, like: str, rows: list[dict]) -> str:
    """A new run with the params of run ``like`` but ``rows`` as its record (sha256 param to match)."""
    data = encode(rows)
    run = client.create_run(client.get_run(like).info.experiment_id).info.run_id
    params = dict(client.get_run(like).data.params) | {ITEMS_PARAM: items_sha256(data)}
    params.pop(EVAL_SIGNATURE_PARAM)  # signed afresh: the evaluator's own record, with values of the wrong kind
    client.log_batch(run, params=[Param(k, v) for k, v in params.items()])
    client.log_param(run, EVAL_SIGNATURE_PARAM, gh.signature(client, run))
    folder = tmp_path / f"items-{run}"
    folder.mkdir()
    (folder / "items.jsonl").write_bytes(data)
    client.log_artifact(run, str(folder / "items.jsonl"), "eval")
    return run
