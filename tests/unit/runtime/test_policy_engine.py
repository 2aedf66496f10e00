"""The one interface between the algorithm and the runtime: the runtime's engines and rank info
have what the trainer's protocols ask for, and ``train``'s keyword options are one record."""

from __future__ import annotations

import dataclasses
import typing

import torch

from components.config_sections import GspoConfig
from components.gspo.policy_engine import PolicyEngine, Ranks
from components.runtime.distributed import DistInfo
from components.runtime.engines import TorchEngine, TrainEngine
from components.runtime.training_run import RunOptions, TrainOptions


def _members(protocol: type) -> set[str]:
    return {name for name in vars(protocol) if not name.startswith("_")}


def test_the_engines_have_every_member_of_policy_engine() -> None:
    assert _members(PolicyEngine) == {"module", "train", "eval", "gathered_parameters", "update"}
    for name in _members(PolicyEngine):
        assert callable(getattr(TrainEngine, name, None)) or isinstance(getattr(TrainEngine, name), property), name


def test_a_torch_engine_updates_through_the_protocol() -> None:
    engine: PolicyEngine = TorchEngine(torch.nn.Linear(3, 1), GspoConfig(lr=1e-2), total_steps=1,
                                       info=DistInfo(0, 1, 0, True))
    x = torch.ones(2, 3)
    before = engine.module.weight.detach().clone()
    norm = engine.update([(2, lambda: engine.module(x).pow(2).mean())])
    assert norm > 0 and not torch.equal(before, engine.module.weight)


def test_dist_info_is_the_ranks_of_one_process() -> None:
    ranks: Ranks = DistInfo(rank=0, world_size=1, local_rank=0, is_main=True)
    assert _members(Ranks) == {"rank", "world_size", "all_gather"}
    assert ranks.all_gather({"a": 1}) == [{"a": 1}]  # one rank: no collective


def test_train_options_and_their_defaults_name_the_same_fields() -> None:
    assert set(typing.get_type_hints(TrainOptions)) == {f.name for f in dataclasses.fields(RunOptions)}
