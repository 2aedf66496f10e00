"""Multi-agent systems: roles, topologies, silence, aggregation and the batched rollout engine.

Attributes are imported lazily so that ``components.mas.records`` (used by the reward module)
does not pull in torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Episode": "records", "Message": "records",
    "RolloutEngine": "engine", "RolloutStats": "engine", "RolloutInputError": "engine",
    "build_adjacency": "topology", "in_neighbours": "topology", "is_dag": "topology", "round_waves": "topology",
    "role_names": "roles", "system_prompt": "roles", "task_family": "roles",
    "format_transcript": "transcript", "episodes_summary": "transcript",
    "run_baseline": "baselines", "baseline_engine": "baselines", "BASELINES": "baselines", "BaselineRun": "baselines",
    "EngineOptions": "calls", "DecodeOptions": "decode", "Decoder": "decode", "Sampling": "decode",
    "Environment": "environment", "grade_episodes": "environment",
    "vote": "voting",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"components.mas.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'components.mas' has no attribute {name!r}")
