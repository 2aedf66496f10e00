"""Fabricated evaluations for the gate's tests: a registered version, an evaluation run with a
per-item record (``eval/items.jsonl`` and its sha256 as a param), and the version's ``eval.*``
tags, exactly as :class:`components.jobs.EvaluateJob` leaves them (no model, no rollouts), signed
with the registry's signing key through the project's own functions (:func:`evaluate`); or, as
someone with write access but without the key would make it, unsigned (:func:`forge`)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import Param

from components.config_sections import SigningConfig
from components.evaluation.items import ITEMS_PARAM, MAIN_PARAM, encode, headline, scores
from components.tracking import GateResult, Trust, load_key, trust_for, write_result
from components.tracking.gate import VERSION_PARAM
from components.tracking.signing import EVAL_SIGNATURE_PARAM, EvaluationClaim, sign

KEY = "gatesetting1"
N = 60


def records(correct: Sequence[bool], tokens: float | Sequence[float], bench: str = "gsm8k",
            system: str = "agent_gspo", ids: Sequence[str] | None = None) -> list[dict]:
    per = [float(tokens)] * len(correct) if isinstance(tokens, (int, float)) else [float(t) for t in tokens]
    ids = list(ids) if ids is not None else [f"q{i}" for i in range(len(correct))]
    return [{"system": system, "benchmark": bench, "id": i, "prediction": "7" if c else "8", "extracted": "7" if c
             else "8", "gold": "7", "correct": bool(c), "grading_error": None,
             "tokens": {"prompt": int(t) // 2, "completion": int(t) - int(t) // 2, "communicated": 0, "total": int(t)},
             "silence": [[0, 0, False]], "transcript": [{"agent": 0, "round": 0, "text": "7" if c else "8",
                                                         "silent": False}]}
            for i, c, t in zip(ids, correct, per, strict=True)]


def register(client: MlflowClient, tmp: Path, name: str) -> str:
    if not client.search_registered_models(filter_string=f"name = '{name}'"):
        client.create_registered_model(name)
    src = tmp / f"src-{time.monotonic_ns()}"
    src.mkdir()
    return str(client.create_model_version(name, str(src)).version)


def trust(client: MlflowClient, settings: SigningConfig | None = None) -> Trust:
    """What ``promote`` on this registry accepts (its configured or generated signing key)."""
    return trust_for(settings or SigningConfig(), client.tracking_uri)


def signature(client: MlflowClient, run_id: str) -> str:
    """The signature an evaluator holding the registry's key gives run ``run_id`` (over its params)."""
    p = client.get_run(run_id).data.params
    claim = EvaluationClaim(run_id, p[VERSION_PARAM], p["setting.key"], p[ITEMS_PARAM], p[MAIN_PARAM])
    return sign(load_key(SigningConfig(), client.tracking_uri, create=True), claim.payload())


def evaluate(client: MlflowClient, tmp: Path, name: str, version: str, rows: list[dict], key: str = KEY) -> str:
    """A signed evaluation run of ``models:/name/version`` holding ``rows``, and the version's tags as
    ``EvaluateJob`` writes them; the run's id (the version's tags point at it)."""
    run_id = forge(client, tmp, name, version, rows, key)
    acc, tok, n = headline(scores(rows, "agent_gspo"))
    write_result(client, name, version, key, {"benchmarks": ["gsm8k"]}, GateResult(acc, tok, n, run_id))
    client.log_param(run_id, EVAL_SIGNATURE_PARAM, signature(client, run_id))
    return run_id


def forge(client: MlflowClient, tmp: Path, name: str, version: str, rows: list[dict], key: str = KEY) -> str:
    """The fabricated evaluation of docs/gate.md, made as anyone with write access but without the key
    can: ``MlflowClient``, ``hashlib`` and ``json`` only. A run of ``models:/name/version`` holding
    ``rows`` (the four params, ``eval/items.jsonl``) and the version's four ``eval.<key>.*`` tags
    saying what the rows add up to (macro accuracy, total tokens, n); the run's id."""
    exp = client.get_experiment_by_name("evals")
    exp_id = exp.experiment_id if exp is not None else client.create_experiment("evals")
    run_id = client.create_run(exp_id).info.run_id
    data = b"".join(json.dumps(r, sort_keys=True, ensure_ascii=False).encode() + b"\n" for r in rows)
    params = {"setting.key": key, "eval.items_sha256": hashlib.sha256(data).hexdigest(),
              "eval.main_system": "agent_gspo", "eval.registered_version": f"models:/{name}/{version}"}
    client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()])
    folder = tmp / f"items-{run_id}"
    folder.mkdir()
    (folder / "items.jsonl").write_bytes(data)
    client.log_artifact(run_id, str(folder / "items.jsonl"), "eval")
    client.set_terminated(run_id)
    mine = [r for r in rows if r.get("system") == "agent_gspo"]
    benches = {r.get("benchmark") for r in mine}
    acc = sum(sum(r.get("correct") is True for r in mine if r.get("benchmark") == b)
              / sum(r.get("benchmark") == b for r in mine) for b in benches) / max(len(benches), 1)
    totals = [(r.get("tokens") or {}).get("total") if isinstance(r.get("tokens"), dict) else 0 for r in mine]
    tokens = sum(t for t in totals if isinstance(t, int | float) and not isinstance(t, bool))
    tags = {"accuracy": repr(float(acc)), "tokens_total": repr(float(tokens)), "n": str(len(mine)), "run_id": run_id}
    for field, value in tags.items():
        client.set_model_version_tag(name, version, f"eval.{key}.{field}", value)
    return run_id


def version(client: MlflowClient, tmp: Path, name: str, acc: float | None, tokens: float | None,
            key: str = KEY, n: int = N) -> str:
    """A version whose record holds ``n`` items, the first ``round(acc * n)`` correct, ``tokens`` in all."""
    v = register(client, tmp, name)
    if acc is not None and tokens is not None:
        k = round(acc * n)
        evaluate(client, tmp, name, v, records([i < k for i in range(n)], tokens / n), key)
    return v


def replace_items(client: MlflowClient, tmp: Path, run_id: str, rows: list[dict]) -> None:
    """Overwrite a run's items file (what someone with artifact-store write access could do)."""
    folder = tmp / f"forged-{time.monotonic_ns()}"
    folder.mkdir()
    (folder / "items.jsonl").write_bytes(encode(rows))
    client.log_artifact(run_id, str(folder / "items.jsonl"), "eval")
