"""Group-relative advantages: zero-spread groups, group statistics, batch / none modes, ids, broadcast."""

from __future__ import annotations

import pytest
import torch

from components.errors import UserError
from components.gspo.advantages import (
    AdvantageInputError,
    group_advantages,
    make_group_ids,
)


def _rewards(seed: int = 0, groups: int = 5, g: int = 4):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.rand(groups * g, generator=gen)
    ids = torch.arange(groups).repeat_interleave(g)
    perm = torch.randperm(groups * g, generator=gen)  # groups need not be contiguous
    return rewards[perm], ids[perm] * 7 + 3  # nor numbered 0..n-1


def test_group_mode_zero_mean_unit_std_per_group():
    r, ids = _rewards()
    res = group_advantages(r, ids)
    assert res.n_groups == 5 and res.zero_spread_groups == 0
    assert res.advantages.dtype == torch.float32 and res.advantages.shape == r.shape
    for gid in ids.unique():
        a = res.advantages[ids == gid]
        assert a.mean().abs() < 1e-6
        assert a.std().item() == pytest.approx(1.0, rel=1e-5)  # sample (Bessel) std, as TRL / verl
        # ordering inside the group is preserved
        assert torch.equal(torch.argsort(a), torch.argsort(r[ids == gid]))


def test_zero_spread_group_gives_exact_zero_and_is_counted():
    r = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.3])
    ids = torch.tensor([0, 0, 0, 1, 1, 2, 2, 3])  # group 3 has one member: no spread either
    res = group_advantages(r, ids)
    assert res.n_groups == 4 and res.zero_spread_groups == 3
    assert torch.equal(res.advantages[[0, 1, 2, 5, 6, 7]], torch.zeros(6))
    torch.testing.assert_close(res.advantages[[3, 4]], torch.tensor([-0.70710678, 0.70710678]))
    # equal float64 rewards whose mean is inexact (0.1 + 0.1 + 0.1 != 0.3) must still give exact zeros
    r64 = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7, 0.7, 0.7], dtype=torch.float64)
    inexact = group_advantages(r64, torch.tensor([0, 0, 0, 1, 1, 1, 1]))
    assert torch.equal(inexact.advantages, torch.zeros(7)) and inexact.zero_spread_groups == 2


def test_std_floor():
    r = torch.tensor([0.0, 1e-9, 2.0, 4.0])
    ids = torch.tensor([0, 0, 1, 1])
    res = group_advantages(r, ids, std_floor=1e-3)
    # tiny but non-zero spread: divided by the floor, not by ~7e-10
    torch.testing.assert_close(res.advantages[:2], torch.tensor([-5e-7, 5e-7]), atol=1e-9, rtol=1e-4)


def test_batch_mode():
    r, ids = _rewards(1)
    res = group_advantages(r, ids, mode="batch")
    torch.testing.assert_close(res.advantages, ((r - r.mean()) / r.std()).float())
    assert res.n_groups == 5
    # group means are not zero in batch mode (it differs from group mode)
    assert not torch.allclose(res.advantages, group_advantages(r, ids).advantages)
    same = group_advantages(torch.full((4,), 0.7), torch.tensor([0, 0, 1, 1]), mode="batch")
    assert torch.equal(same.advantages, torch.zeros(4)) and same.zero_spread_groups == 2


def test_none_mode_is_raw_reward():
    r, ids = _rewards(2)
    res = group_advantages(r, ids, mode="none")
    torch.testing.assert_close(res.advantages, r.float())
    assert res.n_groups == 5


def test_integer_rewards_and_empty_input():
    res = group_advantages(torch.tensor([1, 0, 1, 1]), torch.tensor([0, 0, 1, 1]))
    assert res.advantages.dtype == torch.float32 and res.zero_spread_groups == 1
    empty = group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert empty.advantages.numel() == 0 and empty.n_groups == 0


@pytest.mark.parametrize("bad", ["mode", "len", "float_ids", "nan", "floor"])
def test_bad_input_raises_user_error(bad):
    r, ids = torch.tensor([1.0, 0.0]), torch.tensor([0, 0])
    kw: dict = {}
    if bad == "mode":
        kw["mode"] = "groups"
    elif bad == "len":
        ids = torch.tensor([0, 0, 1])
    elif bad == "float_ids":
        ids = ids.float()
    elif bad == "nan":
        r = torch.tensor([1.0, float("nan")])
    else:
        kw["std_floor"] = 0.0
    with pytest.raises(AdvantageInputError) as exc:
        group_advantages(r, ids, **kw)
    assert isinstance(exc.value, UserError) and exc.value.exit_code == 2


def test_make_group_ids_per_question_and_per_agent_round():
    q = ["q1", "q1", "q2", "q1", "q2", "q2"]
    agent = [0, 1, 0, 0, 1, 1]
    rnd = [0, 0, 0, 0, 0, 1]
    assert make_group_ids(q).tolist() == [0, 0, 1, 0, 1, 1]
    assert make_group_ids(q, agent, rnd).tolist() == [0, 1, 2, 0, 3, 4]
    assert make_group_ids(q).dtype == torch.long
    with pytest.raises(AdvantageInputError):
        make_group_ids(q, agent[:3])
    with pytest.raises(AdvantageInputError):
        make_group_ids()
    with pytest.raises(AdvantageInputError):
        make_group_ids([[1], [2]])


def test_finer_groups_normalise_each_agent_round_separately():
    q = ["a"] * 4
    agent = [0, 0, 1, 1]
    r = torch.tensor([0.0, 1.0, 10.0, 30.0])
    per_q = group_advantages(r, make_group_ids(q)).advantages
    per_agent = group_advantages(r, make_group_ids(q, agent)).advantages
    torch.testing.assert_close(per_agent, torch.tensor([-0.70710678, 0.70710678, -0.70710678, 0.70710678]))
    assert not torch.allclose(per_q, per_agent)
