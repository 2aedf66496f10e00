"""Seeded item sampling: stable, order-independent, nested in the limit, loud on bad input."""

import random

import pytest

from components.data.item import Item
from components.data.sampling import SamplingError, derived_seed, sample_items
from components.errors import UserError

ITEMS = [Item(id=f"gsm8k/test/{i}", benchmark="gsm8k", question=f"q{i}", answer=str(i), answer_type="numeric")
         for i in range(50)]


def test_same_seed_same_ids_regardless_of_file_order():
    a = [i.id for i in sample_items(ITEMS, 7, seed=1234)]
    shuffled = ITEMS[:]
    random.Random(0).shuffle(shuffled)
    b = [i.id for i in sample_items(shuffled, 7, seed=1234)]
    assert a == b and len(a) == len(set(a)) == 7


def test_other_seed_other_sample_and_limits_are_nested():
    a = [i.id for i in sample_items(ITEMS, 10, seed=1)]
    assert a != [i.id for i in sample_items(ITEMS, 10, seed=2)]
    assert [i.id for i in sample_items(ITEMS, 4, seed=1)] == a[:4]
    assert a != [i.id for i in ITEMS[:10]]  # not just the head of the file


def test_no_limit_returns_all_and_large_limit_is_clamped():
    assert len(sample_items(ITEMS, None, seed=0)) == 50
    assert len(sample_items(ITEMS, 500, seed=0)) == 50


@pytest.mark.parametrize("limit", [0, -3, 2.5, True])
def test_bad_limit_is_user_error(limit):
    with pytest.raises(SamplingError, match="limit must be a positive integer"):
        sample_items(ITEMS, limit, seed=0, where="data/gsm8k/test")


def test_duplicate_ids_are_user_errors():
    with pytest.raises(UserError, match="duplicate item ids"):
        sample_items([ITEMS[0], ITEMS[0]], 1, seed=0)


def test_derived_seed_is_stable_and_distinct():
    assert derived_seed(1234, "gsm8k", "agent_gspo", 0) == derived_seed(1234, "gsm8k", "agent_gspo", 0)
    seeds = {derived_seed(1234, b, s, k) for b in ("gsm8k", "mmlu") for s in ("a", "b") for k in range(3)}
    assert len(seeds) == 12 and all(0 <= s < 2**31 for s in seeds)
