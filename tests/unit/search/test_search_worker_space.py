"""``python -m components.search.worker`` samples within the profile's sizes, as ``agent-gspo search`` does.

Was: the worker searched the unbounded default space: under the smoke profile (G 2, 3 agents,
2 rounds) its trials drew G 16, 5 agents, 3 rounds (a real smoke trial at such sizes peaked at
19 GB), and joined a study of `agent-gspo search` with other distributions for the same keys."""

from __future__ import annotations

from pathlib import Path

import optuna

from components.config import load_config
from components.search import worker
from components.search.space import SIZE_KEYS


def test_the_worker_never_samples_above_the_profiles_sizes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    args = ["--synthetic", "--profile", "smoke", "--storage", url, "--trials", "12", "--seed", "3",
            "--out-params", str(tmp_path / "best.yaml")]
    assert worker.main(args) == 0
    flat = load_config(None, "smoke", []).flat()
    trials = optuna.load_study(study_name="agent-gspo", storage=url).trials
    assert len(trials) == 12
    for t in trials:
        for key in SIZE_KEYS:
            if key in t.params:
                assert t.params[key] <= int(flat[key]), (t.number, key, t.params[key], flat[key])
