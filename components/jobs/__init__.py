"""Pipeline jobs: the units the CLI, the Prefect flows and the DVC stages run.

Each job is a frozen pydantic model (the validated :class:`components.config.Config` plus the
options of one call) with a ``run()`` that returns a typed result; see :mod:`components.jobs.base`.
Nothing here imports Prefect: flows wrap ``run()`` in tasks, the CLI prints the results.
Names are imported on first use, so ``agent-gspo prepare`` does not pay for torch or MLflow.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "ConfigSource": "base", "Job": "base", "PrepareJob": "data", "PrepareResult": "data", "ValidateJob": "data",
    "EvaluateJob": "evaluate", "EvaluateResult": "evaluate", "PromoteJob": "promote",
    "RolloutJob": "rollout", "RolloutResult": "rollout",
    "SearchJob": "search", "SearchTrial": "search",
    "TrainJob": "train", "TrainingFailed": "train",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'components.jobs' has no attribute {name!r}")
    return getattr(importlib.import_module(f"components.jobs.{_WHERE[name]}"), name)
