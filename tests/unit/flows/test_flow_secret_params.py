"""The flows' string parameters carry a schema pattern that refuses what ``redact`` would change,
so the Prefect server refuses a deployment run holding a password before storing it (the real
server is in tests/integration/test_prefect_param_secrets.py); deployment defaults hold none."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from helpers.paths import REPO_ROOT
from prefect.utilities.callables import parameter_schema

from components.redact import SECRET_FREE_PATTERN, redact
from flows.data_prep import data_prep_flow
from flows.pipeline import evaluate_flow, pipeline_flow, search_flow

ROOT = REPO_ROOT
CORPUS = [
    "tracking.uri=http://u:PASS@h:5000", "tracking.uri=http://h:5000", "x=http://u@h", "smoke", "",
    "search.storage=postgresql+psycopg://a:b/c@d/e", "q=http://h/?Token=abc", "q=http://h/?tok=abc",
    "model=models:/agent-gspo-policy@champion", "a=b;password=1", "https://user:p%40ss@h", "s3://bucket/x",
    "http://h:5000/path@x", "sqlite:///optuna.db", "tracking.uri=HTTPS://A:B@C", "x?API-KEY=1", "x&sig=", "runs/x",
    "mas.topology=debate", "data.benchmarks=[gsm8k,aqua]", "http://user:pa ss@h",
]


@pytest.mark.parametrize("text", CORPUS)
def test_the_pattern_refuses_exactly_what_redact_changes(text: str) -> None:
    assert bool(re.search(SECRET_FREE_PATTERN, text)) == (redact(text) == text)


def test_the_pattern_is_plain_ecma_and_python_regex() -> None:
    """The UI (JavaScript) and the server (Python) read the same pattern: no inline flags or comments."""
    assert not re.search(r"\(\?[#iPmsx<]", SECRET_FREE_PATTERN.replace("(?!", "").replace("(?:", ""))


@pytest.mark.parametrize("flow_obj", [pipeline_flow, search_flow, evaluate_flow, data_prep_flow])
def test_every_string_parameter_carries_the_pattern(flow_obj) -> None:
    schema = parameter_schema(flow_obj).model_dump_for_openapi()

    def strings(node: object) -> list[dict]:
        if isinstance(node, dict):
            found = [node] if node.get("type") == "string" else []
            return found + [s for v in node.values() for s in strings(v)]
        return [s for v in node for s in strings(v)] if isinstance(node, list) else []

    found = strings(schema["properties"])
    unguarded = [s for s in found if s.get("pattern") != SECRET_FREE_PATTERN]
    assert found and not unguarded, unguarded


def test_a_direct_call_stores_its_parameters_redacted() -> None:
    stored = pipeline_flow.serialize_parameters({"overrides": ["tracking.uri=http://u:PW@h"], "profile": "smoke"})
    assert stored == {"overrides": ["tracking.uri=http://u:***@h"], "profile": "smoke"}


@pytest.mark.parametrize("name", ["prefect.yaml", "infra/prefect-gpu.yaml"])
def test_deployment_defaults_hold_no_secret_and_keep_the_schema_enforced(name: str) -> None:
    """Defaults are stored at deploy time, and the server validates them only on update."""
    for deployment in yaml.safe_load((ROOT / name).read_text())["deployments"]:
        text = json.dumps(deployment.get("parameters") or {})
        assert redact(text) == text, deployment["name"]
        assert deployment.get("enforce_parameter_schema", True) is not False, deployment["name"]
