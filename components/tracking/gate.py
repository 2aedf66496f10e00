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
overwrites the numbers the gate compares. The registered model itself keeps, per setting, the
reference of its champion lineage (tags ``gate.<key>.best_accuracy`` / ``min_tokens`` and the
versions that set them) and ``gate.last_champion``: they survive a deleted champion version or
alias, so neither can lower the bar.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mlflow import MlflowClient

from components.tracking.errors import PromotionError

LAST_CHAMPION_TAG = "gate.last_champion"
LATEST_RUN_TAG = "eval.latest_run_id"
LATEST_KEY_TAG = "eval.latest_setting"


def result_tag(key: str, field: str) -> str:
    return f"eval.{key}.{field}"


def reference_tag(key: str, field: str) -> str:
    return f"gate.{key}.{field}"


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


@dataclass(frozen=True)
class Reference:
    """Best accuracy and fewest tokens of the champion lineage under one setting."""

    accuracy: float
    accuracy_version: str
    tokens_total: float
    tokens_version: str

    def merged(self, version: str, result: GateResult) -> Reference:
        """This reference after ``version`` with ``result`` joined the lineage."""
        acc = (result.accuracy, version) if result.accuracy > self.accuracy else (self.accuracy,
                                                                                self.accuracy_version)
        tok = (result.tokens_total, version) if result.tokens_total < self.tokens_total else (
            self.tokens_total, self.tokens_version)
        return Reference(acc[0], acc[1], tok[0], tok[1])

    @classmethod
    def of(cls, version: str, result: GateResult) -> Reference:
        return cls(result.accuracy, version, result.tokens_total, version)


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


def read_reference(model_tags: Mapping[str, str], key: str, where: str) -> Reference | None:
    """The lineage reference under ``key`` from the registered model's tags, if any, validated like
    a result (``where`` names the registered model in errors)."""
    acc, tok = reference_tag(key, "best_accuracy"), reference_tag(key, "min_tokens")
    if acc not in model_tags or tok not in model_tags:
        return None
    return Reference(_number(model_tags, acc, where, fraction=True),
                     model_tags.get(reference_tag(key, "best_accuracy_version"), "?"),
                     _number(model_tags, tok, where), model_tags.get(reference_tag(key, "min_tokens_version"), "?"))


def write_reference(client: MlflowClient, name: str, key: str, ref: Reference, champion: str) -> None:
    """Store the lineage reference under ``key`` and the newest champion on the registered model."""
    tags = {reference_tag(key, "best_accuracy"): repr(float(ref.accuracy)),
            reference_tag(key, "best_accuracy_version"): ref.accuracy_version,
            reference_tag(key, "min_tokens"): repr(float(ref.tokens_total)),
            reference_tag(key, "min_tokens_version"): ref.tokens_version, LAST_CHAMPION_TAG: champion}
    for tag, value in tags.items():
        client.set_registered_model_tag(name, tag, value)
