"""``splitinfo``: a generated split-information task where who speaks decides the team's answer.

Each item asks for a code that was changed: the question states the OLD code publicly, and the
new code is a fact (``meta["private"]``) that one agent alone is given per episode (see
:func:`components.mas.engine.fact_holder`). An agent without the note can only repeat the stale
code, so when the uninformed agents answer, their two identical wrong votes outvote the informed
one; when the informed agent stays silent nobody has the answer. The best team policy is
therefore strategic silence: the informed agent states the code briefly, the others stay silent.
A 135M model can do this (it copies a number from its prompt), unlike the seven benchmarks,
where it is at chance and the task reward carries no signal.

Generated, not downloaded: the same seed gives the same bytes (``GENERATOR_VERSION`` is recorded
in the manifest as the source). Train and test use disjoint objects, disjoint phrasings and
disjoint ranges of new codes, so held-out accuracy is not memorisation of training facts.
"""

from __future__ import annotations

import random

from components.data.adapters import Record, SplitRecords

GENERATOR_VERSION = "splitinfo-v1"
COUNTS = {"train": 2000, "test": 300}

_OBJECTS = {
    "train": ["locker", "vault", "gate", "safe", "garage", "alarm", "bike lock", "server room", "storage unit",
              "mailbox", "office door", "cabinet", "wifi router", "back door", "shed", "briefcase", "tool chest",
              "side entrance", "file room", "boat cabin"],
    "test": ["warehouse", "lab door", "gym locker", "studio", "supply closet", "basement", "roof hatch",
             "garden gate", "archive", "loading dock", "kiosk", "workshop"],
}
_TEMPLATES = {  # (question, private fact): the question holds the stale code, the fact the new one
    "train": [
        ("The {obj} code used to be {old}, but it was changed. What is the {obj} code now?",
         "The new {obj} code is {new}."),
        ("Last week the {obj} code was {old}. It has since been reset. What is the current {obj} code?",
         "The {obj} code was reset to {new}."),
        ("The old code for the {obj} was {old}. Which code opens the {obj} today?",
         "Today the {obj} opens with code {new}."),
        ("Everyone remembers the {obj} code as {old}, but it changed this morning. What is the {obj} code?",
         "This morning the {obj} code changed to {new}."),
    ],
    "test": [
        ("The {obj} had the code {old} until yesterday, when it was replaced. What is the replacement code?",
         "The replacement code for the {obj} is {new}."),
        ("A sign still says the {obj} code is {old}, but the sign is out of date. What is the real {obj} code?",
         "The real {obj} code is {new}."),
        ("Before the update the {obj} used code {old}. What code does the {obj} use after the update?",
         "After the update the {obj} uses code {new}."),
    ],
}
_NEW_CODES = {"train": (1000, 5499), "test": (5500, 9999)}


def generate_split(split: str, n: int | None = None, seed: int = 0) -> list[Record]:
    """``n`` (default :data:`COUNTS`) normalised records of ``split``, deterministic in ``seed``."""
    rng = random.Random(f"{GENERATOR_VERSION}:{split}:{seed}")
    low, high = _NEW_CODES[split]
    rows: list[Record] = []
    for i in range(COUNTS[split] if n is None else n):
        obj = rng.choice(_OBJECTS[split])
        k = rng.randrange(len(_TEMPLATES[split]))
        question, fact = _TEMPLATES[split][k]
        new = rng.randint(low, high)
        old = rng.randint(1000, 9999)
        while old == new:
            old = rng.randint(1000, 9999)
        rows.append({"id": f"splitinfo/{split}/{i}", "benchmark": "splitinfo", "split": split,
                     "question": question.format(obj=obj, old=old), "choices": None, "answer": str(new),
                     "answer_type": "numeric",
                     "meta": {"private": fact.format(obj=obj, new=new), "stale_answer": str(old), "object": obj,
                              "template": k}})
    return rows


def generate() -> SplitRecords:
    """Every split of the benchmark (the "source" of ``agent-gspo prepare --benchmarks splitinfo``)."""
    return {split: generate_split(split) for split in COUNTS}
