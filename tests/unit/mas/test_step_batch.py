"""The step batch's silence statistics: per team agent and round, and the decision agent apart
(``silence/decider``; it used to be logged as ``silence/agent<N>_round<R>``, a team agent N that
does not exist)."""

from __future__ import annotations

from components.config import Config
from components.gspo.step_batch import StepBatch
from components.mas.records import Episode, Message
from components.reward.reward import apply_rewards
from components.runtime.distributed import DistInfo
from components.scoring.result import ScoreResult
from components.tracking.metric_names import validate_metrics

ONE_RANK = DistInfo(rank=0, world_size=1, local_rank=0, is_main=True)


def _message(agent: int, rnd: int, silent: bool, role: str = "solver") -> Message:
    return Message("q/0", 0, agent, role, rnd, [5, 6], [1] if silent else [7, 8], [-0.1] * (1 if silent else 2),
                   silent, text="" if silent else "42")


def _episode(group_index: int, decider_silent: bool) -> Episode:
    team = [_message(a, r, silent=(a == 1)) for r in range(2) for a in range(3)]
    ep = Episode("q/0", group_index, "gsm8k", [*team, _message(3, 2, decider_silent, role="decider")])
    ep.grade = ScoreResult(correct=group_index == 0, extracted="42", error=None)
    return ep


def test_the_decision_agent_is_logged_apart_from_the_team() -> None:
    cfg = Config.model_validate({"mas": {"agents": 3, "rounds": 2, "aggregation": "decision_agent"}})
    episodes = [_episode(0, decider_silent=False), _episode(1, decider_silent=True),
                _episode(2, decider_silent=True), _episode(3, decider_silent=True)]
    apply_rewards(episodes, cfg.reward, 0.1)
    batch = StepBatch.build(episodes, cfg, ONE_RANK, 0.1, pad_id=0,
                            device="cpu")
    silence = {k: v for k, v in batch.metrics.items() if k.startswith("silence/")}
    assert silence == {**{f"silence/agent{a}_round{r}": float(a == 1) for a in range(3) for r in range(2)},
                       "silence/decider": 0.75}
    validate_metrics(batch.metrics)  # every name is in the logged vocabulary


def test_without_a_decider_there_is_no_decider_key() -> None:
    cfg = Config.model_validate({"mas": {"agents": 3, "rounds": 2}})
    ep = _episode(0, decider_silent=False)
    ep.messages = ep.messages[:-1]
    apply_rewards([ep], cfg.reward, 0.1)
    batch = StepBatch.build([ep], cfg, ONE_RANK, 0.1, pad_id=0, device="cpu")
    assert "silence/decider" not in batch.metrics
    assert sorted(k for k in batch.metrics if k.startswith("silence/agent")) == [
        f"silence/agent{a}_round{r}" for a in range(3) for r in range(2)]
