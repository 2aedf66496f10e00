"""Every promotion decision as an MLflow run: a history of crownings that is not a deletable tag.

The gate must know whether a registered model ever had a champion: without one, the next
candidate is judged as a "first model" (only ``registry.min_accuracy`` and ``min_items``). Tags
on the registered model, and the ``@champion`` alias, can be deleted by anyone with write access,
so that history is recomputed from two sources the gate reads on every decision:

* the versions' own ``promotion.*`` tags (``promotion.decision = champion``), and
* this log: one run per decision (champion, challenger, rejected) in the experiment
  ``<registered model>.promotions``, whose PARAMS (immutable in MLflow) hold the version, the
  decision, the setting, the evaluation run and the sha256 of its per-item record, and the rule.

Each run is signed (param ``signature``, :mod:`components.tracking.signing`) over its id and the
fields the gate reads; :func:`crownings` ignores, with a warning naming it, a run whose signature
is missing (unless ``registry.signing.accept_unsigned``) or does not verify: a crowning logged
with plain ``MlflowClient`` calls by someone without the key sets no bar.

Deleting a run only marks it deleted: the gate searches deleted runs too (``ViewType.ALL``), so
only ``mlflow gc`` (an administrator on the tracking server's database) removes a crowning from
the log, and then the versions' tags still hold it. A crowned version that was itself deleted
still counts: its evaluation run (named in the log) is the reference the next candidate is paired
with. docs/gate.md says what an administrator can still do.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from mlflow import MlflowClient
from mlflow.entities import Param, ViewType
from mlflow.exceptions import MlflowException

from components.tracking.signing import (
    DECISION_SIGNATURE_PARAM,
    SigningKey,
    Trust,
    decision_payload,
    sign,
    signature_problem,
)

SUFFIX = ".promotions"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Crowning:
    """One decision that made a version ``@champion``."""

    version: str
    setting: str
    eval_run_id: str
    items_sha256: str
    decided_at_ms: int


def experiment_name(name: str) -> str:
    return f"{name}{SUFFIX}"


def _experiment_id(client: MlflowClient, name: str, *, create: bool) -> str | None:
    exp = client.get_experiment_by_name(experiment_name(name))
    if exp is None:
        if not create:
            return None
        try:
            return client.create_experiment(experiment_name(name))
        except MlflowException:  # created meanwhile by a concurrent promotion
            exp = client.get_experiment_by_name(experiment_name(name))
            if exp is None:
                raise
    if exp.lifecycle_stage == "deleted":  # a deleted experiment still holds its runs: bring it back
        client.restore_experiment(exp.experiment_id)
    return str(exp.experiment_id)


@dataclass(frozen=True)
class Entry:
    """One decision to log: the version, what was decided and why, and its evidence and rule (params)."""

    version: str
    decision: str
    reason: str
    params: Mapping[str, str]


def record_decision(client: MlflowClient, name: str, entry: Entry, key: SigningKey | None) -> str:
    """Log one decision as a finished run (params: model, version, decision and ``entry.params``,
    signed under ``key``; unsigned without one); its id."""
    exp_id = _experiment_id(client, name, create=True)
    reason = entry.reason[:5000]
    run = client.create_run(exp_id, run_name=f"v{entry.version} {entry.decision}",
                            tags={"mlflow.note.content": reason, "promotion.reason": reason})
    run_id = run.info.run_id
    items = {k: str(v)[:6000] for k, v in {"model": name, "version": str(entry.version), "decision": entry.decision,
                                           **entry.params}.items()}
    if key is not None:
        items[DECISION_SIGNATURE_PARAM] = sign(key, decision_payload(run_id, items))
    client.log_batch(run_id, params=[Param(k, v) for k, v in items.items()])
    client.set_terminated(run_id)
    return run_id


def crownings(client: MlflowClient, name: str, trust: Trust) -> list[Crowning]:
    """Every logged decision that crowned a version of ``name`` and whose signature ``trust`` accepts,
    newest first (deleted runs included); each one refused is a warning naming its run and why."""
    exp_id = _experiment_id(client, name, create=False)
    if exp_id is None:
        return []
    runs = client.search_runs([exp_id], filter_string="params.decision = 'champion'", run_view_type=ViewType.ALL,
                              max_results=5000, order_by=["attributes.start_time DESC"])
    out = []
    for r in runs:
        p = r.data.params
        if p.get("model") != name:
            continue
        what = f"decision-log run {r.info.run_id} (v{p.get('version', '?')} champion)"
        why = signature_problem(trust, decision_payload(r.info.run_id, p), p.get(DECISION_SIGNATURE_PARAM), what)
        if why is not None:
            log.warning("warning: %s is not trusted, ignored: %s", what, why)
            continue
        out.append(Crowning(p.get("version", ""), p.get("setting", ""), p.get("eval_run_id", ""),
                            p.get("items_sha256", ""), int(r.info.start_time or 0)))
    return out


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
