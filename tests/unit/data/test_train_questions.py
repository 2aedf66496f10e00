"""Which training questions a run sees: never the evaluation sample; pooled or balanced mixing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from components.config import load_config
from components.data.item import Item
from components.data.sampling import sample_items
from components.data.train_items import load_train_items
from components.errors import UserError
from components.gspo.trainer import QuestionSampler

BIG = [Item(id=f"g/{i}", benchmark="gsm8k", split="train", question=f"q{i}", answer=str(i), answer_type="numeric")
       for i in range(50)]
SMALL = [Item(id=f"h/{i}", benchmark="humaneval", split="test", question=f"p{i}", answer="pass", answer_type="code")
         for i in range(3)]


def test_pooled_draws_the_historical_stream():
    """``pooled`` (the default) is one permutation of all items per epoch, seeded ``seed + epoch``:
    runs recorded before ``data.train_mix`` existed draw the same questions."""
    items = BIG + SMALL
    drawn = [x.id for x in QuestionSampler(items, seed=7).next_batch(120)]
    expected = []
    for c in range(120):
        epoch, pos = divmod(c, len(items))
        expected.append(items[int(np.random.default_rng(7 + epoch).permutation(len(items))[pos])].id)
    assert drawn == expected


def test_balanced_takes_benchmarks_in_turn_each_shuffled_per_epoch():
    drawn = QuestionSampler(BIG + SMALL, seed=7, mix="balanced").next_batch(12)
    assert [x.benchmark for x in drawn] == ["gsm8k", "humaneval"] * 6
    small = [x.id for x in drawn if x.benchmark == "humaneval"]
    assert sorted(small[:3]) == sorted(small[3:]) == sorted(x.id for x in SMALL)  # two epochs of 3
    big = [x.id for x in drawn if x.benchmark == "gsm8k"]
    assert len(set(big)) == 6  # no repeat within the big source's first epoch


def test_balanced_resumes_from_the_cursor_alone():
    a = QuestionSampler(BIG + SMALL, seed=3, mix="balanced")
    first = [x.id for x in a.next_batch(25)]
    b = QuestionSampler(BIG + SMALL, seed=3, mix="balanced")
    b.next_batch(9)
    c = QuestionSampler(BIG + SMALL, seed=3, mix="balanced", cursor=b.cursor)
    assert [x.id for x in c.next_batch(16)] == first[9:]


def test_unknown_mix_is_refused():
    with pytest.raises(ValueError, match="mix must be 'pooled' or 'balanced'"):
        QuestionSampler(BIG, seed=0, mix="weighted")


def test_train_mix_is_validated_by_the_schema():
    from components.config import ConfigError

    with pytest.raises(ConfigError, match="train_mix"):
        load_config(overrides=["data.train_mix=weighted"])


def test_training_never_sees_the_evaluation_sample(prepared_data: Path):
    cfg = load_config(overrides=["data.train_sources=['humaneval/test', 'gsm8k/train']", "eval.limit=100",
                                 "eval.seed=0"])
    from components.data.prepare import load_split

    humaneval = load_split(prepared_data, "humaneval", "test")
    evaluated = {i.id for i in sample_items(humaneval, 100, 0)}
    items = load_train_items(cfg, prepared_data)
    trained = {i.id for i in items if i.benchmark == "humaneval"}
    assert len(trained) == len(humaneval) - 100 and not trained & evaluated
    assert sum(i.benchmark == "gsm8k" for i in items) == len(load_split(prepared_data, "gsm8k", "train"))


def test_a_split_evaluated_whole_leaves_nothing_to_train_on(prepared_data: Path):
    cfg = load_config(overrides=["data.train_sources=['humaneval/test']", "eval.limit=null"])
    with pytest.raises(UserError, match=r"'humaneval/test' is evaluated whole .*no item is left"):
        load_train_items(cfg, prepared_data)


def test_a_test_split_not_evaluated_is_used_whole(prepared_data: Path):
    cfg = load_config(overrides=["data.train_sources=['humaneval/test']", "eval.benchmarks=[gsm8k]", "eval.limit=10"])
    assert len(load_train_items(cfg, prepared_data)) == 164
