"""What the promotion gate reads and writes in the registry, keyed by evaluation setting.

An evaluation of a registered version stores its headline numbers as version tags under the key
of the setting it ran under (benchmarks, item sample, seed, data manifest, protocol; see
:mod:`components.evaluation.setting`)::

    eval.<key>.accuracy      macro accuracy of the evaluated system
    eval.<key>.tokens_total  total tokens over the evaluated items
    eval.<key>.n             evaluated items
    eval.<key>.run_id        the MLflow run that measured them
    eval.<key>.setting       the setting, readable (JSON)

So an evaluation under another setting (one benchmark, ``--limit 5``) writes other keys and never
overwrites the numbers the gate compares.

Those tags are editable, so the gate never decides on them: :func:`load_evidence` follows
``run_id`` to the evaluation run, downloads its per-item record (``eval/items.jsonl``,
:mod:`components.evaluation.items`), checks its sha256 against the run's immutable param
``eval.items_sha256``, checks the run's params name this version and this setting, checks the
run's signature (:mod:`components.tracking.signing`: the run was made by an evaluator holding the
signing key, else :class:`~components.tracking.signing.UntrustedRecord`), and recomputes accuracy,
tokens and n from the items; :func:`check_tags` then refuses a version whose tags disagree with
that record (:class:`EvidenceMismatch`, exit 2 naming both values).
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from components.comparison import ItemScore
from components.items_file import ITEMS_ARTIFACT, ITEMS_PARAM, MAIN_PARAM, decode, headline, items_sha256, scores
from components.tracking.errors import PromotionError
from components.tracking.signing import EVAL_SIGNATURE_PARAM, EvaluationClaim, Trust, UntrustedRecord, signature_problem

LATEST_RUN_TAG = "eval.latest_run_id"
LATEST_KEY_TAG = "eval.latest_setting"
VERSION_PARAM = "eval.registered_version"
"""evaluation-run param: the registry version evaluated (``models:/<name>/<v>``), immutable"""


class NoItemRecord(PromotionError):
    """An evaluation run without a per-item record (from before evaluations kept their items)."""


def result_tag(key: str, field: str) -> str:
    return f"eval.{key}.{field}"


@dataclass(frozen=True)
class GateResult:
    """The numbers the gate compares for one version under one setting."""

    accuracy: float
    tokens_total: float
    n: int = 0
    run_id: str | None = None

    def __post_init__(self) -> None:
        for what, value in (("accuracy", self.accuracy), ("tokens_total", self.tokens_total)):
            if not math.isfinite(value):
                raise PromotionError(f"{what} {value!r} is not finite")
        if not 0.0 <= self.accuracy <= 1.0:
            raise PromotionError(f"accuracy {self.accuracy} is outside [0, 1]")
        if self.tokens_total < 0:
            raise PromotionError(f"tokens_total {self.tokens_total} is negative")


def write_result(client: MlflowClient, name: str, version: str, key: str, setting: Mapping[str, Any],
                 result: GateResult) -> None:
    """Record an evaluation of ``name`` v``version`` under setting ``key`` (other keys untouched)."""
    tags = {result_tag(key, "accuracy"): repr(float(result.accuracy)),
            result_tag(key, "tokens_total"): repr(float(result.tokens_total)),
            result_tag(key, "n"): str(int(result.n)), result_tag(key, "run_id"): result.run_id or "",
            result_tag(key, "setting"): json.dumps(dict(setting), sort_keys=True)[:5000],
            LATEST_RUN_TAG: result.run_id or "", LATEST_KEY_TAG: key}
    for tag, value in tags.items():
        client.set_model_version_tag(name, version, tag, value)


def _number(tags: Mapping[str, str], tag: str, where: str, *, fraction: bool = False) -> float:
    """The tag as a number the gate can compare: finite, >= 0, and <= 1 when ``fraction`` (an
    accuracy). A stored NaN or infinity would silently switch a check off (``x > nan`` is False),
    so it is an error naming ``where`` (the version or registered model) and the tag."""
    try:
        value = float(tags[tag])
    except (TypeError, ValueError):
        raise PromotionError(f"{where}: tag {tag} = {tags[tag]!r} is not a number") from None
    if not math.isfinite(value):
        problem = "is not finite"
    elif fraction and not 0.0 <= value <= 1.0:
        problem = "is outside [0, 1]"
    elif value < 0:
        problem = "is negative"
    else:
        return value
    raise PromotionError(f"{where}: tag {tag} = {tags[tag]!r} {problem} (a corrupted or hand-edited tag: "
                         "correct or delete it)")


def read_result(tags: Mapping[str, str], key: str, where: str) -> GateResult | None:
    """The result under ``key`` in a version's tags, or None when it was never evaluated so.

    ``where`` names the version in errors (e.g. ``candidate 'policy' v2``)."""
    acc, tok = result_tag(key, "accuracy"), result_tag(key, "tokens_total")
    if acc not in tags or tok not in tags:
        return None
    n = tags.get(result_tag(key, "n"), "0")
    return GateResult(_number(tags, acc, where, fraction=True), _number(tags, tok, where),
                      int(n) if n.isdigit() else 0, tags.get(result_tag(key, "run_id")) or None)


def evaluated_settings(tags: Mapping[str, str]) -> list[str]:
    """Setting keys a version has results for (for error messages)."""
    return sorted({t.split(".")[1] for t in tags if t.startswith("eval.") and t.endswith(".accuracy")
                   and t.count(".") == 2})


class EvidenceMismatch(PromotionError):
    """A version's tags, or an items file, disagree with the evaluation run's immutable record."""


@dataclass(frozen=True)
class Evidence:
    """A verified per-item record: the main system's items of one evaluation run, and what they add up to."""

    run_id: str
    sha256: str
    system: str
    scores: dict[str, list[ItemScore]]
    accuracy: float
    tokens_total: float
    n: int


def _params(client: MlflowClient, run_id: str, where: str) -> dict[str, str]:
    try:
        return dict(client.get_run(run_id).data.params)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            raise PromotionError(f"{where}: evaluation run {run_id} does not exist (deleted for good?): "
                                 "evaluate again") from None
        raise


def check_signature(params: Mapping[str, str], run_id: str, where: str, trust: Trust) -> None:
    """:class:`UntrustedRecord` (one line: ``where``, the run, unsigned or which mismatch, what to do)
    unless evaluation run ``run_id`` is signed under ``trust``'s key over what its params claim."""
    claim = EvaluationClaim(run_id, params.get(VERSION_PARAM, ""), params.get("setting.key", ""),
                            params.get(ITEMS_PARAM, ""), params.get(MAIN_PARAM, ""))
    what = f"{where}: evaluation run {run_id}"
    why = signature_problem(trust, claim.payload(), params.get(EVAL_SIGNATURE_PARAM), what)
    if why is not None:
        raise UntrustedRecord(f"{where}: evaluation run {run_id} refused, {why}; evaluate the version again "
                              "with the signing key (docs/gate.md)")


def load_evidence(client: MlflowClient, run_id: str, where: str, *, key: str, version_uri: str | None,
                  trust: Trust) -> Evidence:
    """The verified per-item record of evaluation run ``run_id`` (module docstring).

    ``version_uri`` (``models:/<name>/<v>``) must be what the run evaluated (None: not checked,
    e.g. a deleted former champion known only through the decision log); the run must be signed
    under ``trust``. Raises :class:`NoItemRecord` (an evaluation from before per-item records),
    :class:`UntrustedRecord` and :class:`EvidenceMismatch`."""
    params = _params(client, run_id, where)
    recorded = params.get(ITEMS_PARAM)
    if not recorded:
        raise NoItemRecord(f"{where}: evaluation run {run_id} has no per-item record (no param {ITEMS_PARAM}; "
                           "measured before evaluations kept their items): evaluate it again")
    if params.get("setting.key") != key:
        raise EvidenceMismatch(f"{where}: evaluation run {run_id} measured setting {params.get('setting.key')}, "
                               f"not the gate's {key} (its eval.{key}.run_id tag points elsewhere)")
    measured = params.get(VERSION_PARAM)
    if version_uri is not None and measured != version_uri:
        raise EvidenceMismatch(f"{where}: evaluation run {run_id} measured {measured or 'an unregistered model'}, "
                               f"not {version_uri} (its eval.{key}.run_id tag points elsewhere)")
    check_signature(params, run_id, where, trust)
    with tempfile.TemporaryDirectory(prefix="agent-gspo-items-") as tmp:
        try:
            local = client.download_artifacts(run_id, ITEMS_ARTIFACT, tmp)
            data = Path(local).read_bytes()
        except (MlflowException, OSError) as exc:
            raise EvidenceMismatch(f"{where}: evaluation run {run_id} lacks its items file {ITEMS_ARTIFACT} "
                                   f"({str(exc).splitlines()[0][:200]})") from None
    actual = items_sha256(data)
    if actual != recorded:
        raise EvidenceMismatch(f"{where}: {ITEMS_ARTIFACT} of run {run_id} has sha256 {actual}, but the run's "
                               f"param {ITEMS_PARAM} = {recorded}: the record was replaced after the evaluation")
    system = params.get(MAIN_PARAM, "")
    by_bench = scores(decode(data, f"{ITEMS_ARTIFACT} of run {run_id}"), system)
    if not by_bench:
        raise EvidenceMismatch(f"{where}: {ITEMS_ARTIFACT} of run {run_id} holds no item of its main system "
                               f"{system!r}")
    acc, tok, n = headline(by_bench)
    return Evidence(run_id, actual, system, by_bench, acc, tok, n)


def check_tags(result: GateResult, evidence: Evidence, key: str, where: str) -> None:
    """:class:`EvidenceMismatch` unless the version's tags say what its verified record says."""
    pairs = (("accuracy", result.accuracy, evidence.accuracy, 1e-9), ("tokens_total", result.tokens_total,
                                                                      evidence.tokens_total, 0.5),
             ("n", float(result.n), float(evidence.n), 0.5))
    for field, tagged, verified, slack in pairs:
        if abs(tagged - verified) > slack:
            raise EvidenceMismatch(f"{where}: tag {result_tag(key, field)} = {tagged:g} but its verified per-item "
                                   f"record (run {evidence.run_id}) gives {verified:g}: the tags were edited; "
                                   "evaluate the version again")
