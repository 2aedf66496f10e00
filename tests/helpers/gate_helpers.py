"""Fabricated evaluations for the gate's tests: a registered version, an evaluation run with a
per-item record (``eval/items.jsonl`` and its sha256 as a param), and the version's ``eval.*``
tags, exactly as :class:`components.jobs.EvaluateJob` leaves them (no model, no rollouts)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import Param

from components.evaluation.items import ITEMS_PARAM, MAIN_PARAM, encode, headline, items_sha256, scores
from components.tracking import GateResult, write_result
from components.tracking.gate import VERSION_PARAM

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


def evaluate(client: MlflowClient, tmp: Path, name: str, version: str, rows: list[dict], key: str = KEY) -> str:
    """An evaluation run of ``models:/name/version`` holding ``rows``; its id (the version's tags point at it)."""
    exp = client.get_experiment_by_name("evals")
    exp_id = exp.experiment_id if exp is not None else client.create_experiment("evals")
    run_id = client.create_run(exp_id).info.run_id
    data = encode(rows)
    client.log_batch(run_id, params=[Param("setting.key", key), Param(ITEMS_PARAM, items_sha256(data)),
                                     Param(MAIN_PARAM, "agent_gspo"),
                                     Param(VERSION_PARAM, f"models:/{name}/{version}")])
    folder = tmp / f"items-{run_id}"
    folder.mkdir()
    (folder / "items.jsonl").write_bytes(data)
    client.log_artifact(run_id, str(folder / "items.jsonl"), "eval")
    client.set_terminated(run_id)
    acc, tok, n = headline(scores(rows, "agent_gspo"))
    write_result(client, name, version, key, {"benchmarks": ["gsm8k"]}, GateResult(acc, tok, n, run_id))
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
