"""The generated split-information benchmark: reproducible, held-out split disjoint from training,
prepared and validated like the mirrored benchmarks, readable by the grader."""

from __future__ import annotations

from helpers import grade_text

from components.data.prepare import load_split, prepare
from components.data.splitinfo import COUNTS, generate_split


def test_generation_is_reproducible_and_the_test_split_is_held_out():
    a, b = generate_split("train"), generate_split("train")
    assert a == b and len(a) == COUNTS["train"] and len(generate_split("test")) == COUNTS["test"]
    assert generate_split("train", seed=1) != a
    train, test = generate_split("train"), generate_split("test")
    objects = lambda rows: {r["meta"]["object"] for r in rows}  # noqa: E731
    phrasing = lambda rows: {r["question"].split("{")[0][:25] for r in rows}  # noqa: E731
    assert not objects(train) & objects(test)
    assert not {r["answer"] for r in train} & {r["answer"] for r in test}
    assert not {r["meta"]["private"] for r in train} & {r["meta"]["private"] for r in test}
    assert len(phrasing(train)) > 1 and len(phrasing(test)) > 1
    for r in train[:50] + test[:50]:
        assert r["answer"] in r["meta"]["private"] and r["answer"] not in r["question"]
        assert r["meta"]["stale_answer"] in r["question"] and r["meta"]["stale_answer"] != r["answer"]


def test_prepared_validated_and_graded(tmp_path):
    report = prepare(["splitinfo"], mirror=None, out_dir=tmp_path, progress=False)
    assert report.results[0].source == "generated:splitinfo-v1"
    assert report.results[0].splits == COUNTS
    items = load_split(tmp_path, "splitinfo", "test")
    it = items[0]
    assert it.private_fact and it.answer_type == "numeric"
    assert grade_text("numeric", it.private_fact, it.answer).correct  # the fact itself answers the question
    assert not grade_text("numeric", f"The code is {it.meta['stale_answer']}.", it.answer).correct
