"""Flow helpers that need no Prefect server: the weekly search's best parameters reach the nightly run."""

from __future__ import annotations

from pathlib import Path

from components.jobs import ConfigSource
from components.search import write_best_params
from flows.pipeline import with_best_params

ROOT = Path(__file__).resolve().parents[2]


def test_best_params_file_feeds_the_pipeline_under_the_users_overrides(tmp_path: Path) -> None:
    source = ConfigSource(params=str(ROOT / "params.yaml"), profile="smoke", overrides=("mas.rounds=1",))
    said: list[str] = []
    missing = tmp_path / "best.yaml"
    assert with_best_params(source, str(missing), said.append) == source
    assert said == [f"no best-parameters file at {missing} yet; training with the profile's parameters"]
    write_best_params(missing, ["mas.agents=2", "mas.rounds=2", "reward.lambda_tok=0.05"], {"trial": 3})
    cfg = with_best_params(source, str(missing), said.append).load()
    assert (cfg.mas.agents, cfg.reward.lambda_tok) == (2, 0.05)
    assert cfg.mas.rounds == 1  # the deployment's / user's own overrides still win
    assert said[-1].startswith(f"applying the search's best parameters from {missing}: mas.agents=2")
    assert with_best_params(source, None, said.append) == source
