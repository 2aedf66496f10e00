"""The split-information task, second version: every irrelevant cue varied in training, held-out
families and team sizes disjoint from training, deterministic, recorded per item and in the spec."""

from __future__ import annotations

import json

import pytest
from helpers import grade_text

from components.data import splitinfo_v2
from components.data.prepare import load_split, prepare
from components.data.spec import get_spec
from components.data.splitinfo_v2 import COUNTS, DESIGN, MAX_TEAM, generate_split

TRAIN, TEST = generate_split("train"), generate_split("test")


def _used(rows: list[dict], axis: str) -> set:
    if axis == "team_size":
        return {r["meta"]["agents"] for r in rows}
    if axis == "header":  # one per agent; a missing note line has none
        return {h for r in rows for h, n in zip(r["meta"]["headers"], r["meta"]["notes"], strict=True) if n is not None}
    return {r["meta"]["families"][axis] for r in rows} - {None}


def test_same_seed_same_bytes_other_seed_other_items():
    for split in COUNTS:
        a = json.dumps(generate_split(split), sort_keys=True).encode()
        assert a == json.dumps(generate_split(split), sort_keys=True).encode()
        assert len(generate_split(split)) == COUNTS[split]
    assert generate_split("train", seed=1) != TRAIN
    assert generate_split("train", n=7) == TRAIN[:7]


def test_held_out_families_and_team_sizes_never_appear_in_train():
    for axis in DESIGN["train"]:
        assert not set(DESIGN["train"][axis]) & set(DESIGN["test"][axis]), axis
        # what the items use is what the design says, on both sides
        assert _used(TRAIN, axis) == set(DESIGN["train"][axis]), axis
        assert _used(TEST, axis) == set(DESIGN["test"][axis]), axis
        assert not _used(TRAIN, axis) & _used(TEST, axis), axis
    # the note texts themselves: no held-out note line is ever seen in training (facts hold codes,
    # so compare the rendered lines with the numbers masked)
    mask = lambda text: "".join("#" if c.isdigit() else c for c in text)  # noqa: E731
    lines = lambda rows: {mask(n) for r in rows for n in r["meta"]["notes"] if n is not None}  # noqa: E731
    questions = lambda rows: {mask(r["question"]) for r in rows}  # noqa: E731
    assert not lines(TRAIN) & lines(TEST)
    assert not {r["meta"]["object"] for r in TRAIN} & {r["meta"]["object"] for r in TEST}
    assert not {r["answer"] for r in TRAIN} & {r["answer"] for r in TEST}
    assert len(questions(TRAIN)) > 1 and len(questions(TEST)) > 1


def test_the_design_is_recorded_in_the_spec():
    spec = get_spec("splitinfo2")
    assert spec.generated and spec.design == DESIGN and spec.expected == COUNTS
    assert get_spec("splitinfo").design == {}  # version 1 unchanged
    assert MAX_TEAM == 6


def test_training_items_vary_every_cue():
    meta = [r["meta"] for r in TRAIN]
    assert len(DESIGN["train"]["fact"]) >= 8 and len(DESIGN["train"]["none"]) >= 4
    assert {m["agents"] for m in meta} >= {2, 5}
    assert {len(m["informed"]) for m in meta} == {0, 1, 2}
    assert {m["note_first"] for m in meta} == {True, False}
    kinds = {k for m in meta for k in m["note_kinds"]}
    assert kinds == {"fact", "none", "distractor"}
    notes = [n for m in meta for n, k in zip(m["notes"], m["note_kinds"], strict=True) if k == "none"]
    assert None in notes and any(n is not None and n.endswith(":") for n in notes)  # missing and empty notes
    facts = {m["family"]: m["private"] for m in meta if m["informed"]}
    assert len(facts) == 8
    for r in TRAIN:  # value first or last, with or without the stale code, as the family says
        fact, family = r["meta"]["private"], r["meta"]["family"]
        assert ("stale" in family) == (r["meta"]["stale_answer"] in fact)
        first = fact.startswith(r["answer"])
        assert first == family.endswith("_first") and first != fact.rstrip(".").endswith(r["answer"])


def test_each_item_is_consistent_with_what_it_records():
    for r in TRAIN + TEST:
        m = r["meta"]
        team, informed = m["agents"], m["informed"]
        assert len(m["notes"]) == len(m["note_kinds"]) == team and 0 <= len(informed) <= 2
        assert informed == sorted(informed) and all(0 <= a < team for a in informed)
        assert m["answerable"] == bool(informed)
        assert r["answer"] in m["private"] and r["answer"] not in r["question"]
        assert m["stale_answer"] in r["question"] and m["stale_answer"] != r["answer"]
        for agent, (note, kind) in enumerate(zip(m["notes"], m["note_kinds"], strict=True)):
            assert (kind == "fact") == (agent in informed)
            if kind == "fact":
                assert note.endswith(m["private"])
            elif kind == "distractor":
                assert any(d in note for d in m["distractor_values"]) and r["answer"] not in note
            elif note is not None:
                assert not any(c.isdigit() for c in note)
        assert m["distractor"] == ("distractor" in m["note_kinds"]) == bool(m["distractor_values"])
        assert (m["families"]["distractor"] is None) == (not m["distractor"])
        assert r["answer"] not in m["distractor_values"]


V1_SHA256 = {  # data/manifest.json's input hashes of version 1, as prepared before version 2 existed
    "test": "bdcbb3e5b0996bc6c1b37320609e2b25287482ead9d42831a97411755fa85afa",
    "train": "48c2cebda827847e64f71eebbef6e7e1339b83e58992fb8b8e0dad3767a7b133",
}


def test_version_one_is_untouched():
    from components.data.sources import load_benchmark

    loaded = load_benchmark("splitinfo", mirror=None)
    assert loaded.source == "generated:splitinfo-v1"
    assert loaded.input_sha256 == {f"generated:splitinfo-v1/{k}": v for k, v in V1_SHA256.items()}


def test_prepared_twice_gives_the_same_files_and_grades(tmp_path):
    a = prepare(["splitinfo2"], mirror=None, out_dir=tmp_path / "a", progress=False).results[0]
    b = prepare(["splitinfo2"], mirror=None, out_dir=tmp_path / "b", progress=False).results[0]
    assert a.source == f"generated:{splitinfo_v2.GENERATOR_VERSION}" and a.splits == COUNTS
    assert a.output_sha256 == b.output_sha256
    items = load_split(tmp_path / "a", "splitinfo2", "test")
    it = next(i for i in items if i.meta["informed"] and "new_last" in i.meta["family"])
    assert it.private_fact and list(it.meta["notes"]) == TEST[int(it.id.rsplit("/", 1)[1])]["meta"]["notes"]
    assert grade_text("numeric", it.private_fact, it.answer).correct
    assert not grade_text("numeric", f"The code is {it.meta['stale_answer']}.", it.answer).correct


def test_an_unknown_split_is_named():
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        generate_split("dev")
