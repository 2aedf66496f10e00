"""``splitinfo2``: the split-information task, second version, with every irrelevant cue varied.

Version 1 (:mod:`components.data.splitinfo`, kept byte for byte) had 4 fact templates, one fixed
"you have no note" line, one number per fact, the note always after the question and always 3
agents with one informed. A policy trained on it fell silent by surface cue, not by what it knew
(issue 52: silence all or nothing per question wording, never silent under a reworded empty note,
answering with any number a note carried). Here each item draws, independently:

* a **fact family** (how the informed note states the new code): value first or last, a sentence or
  a terse log line, with or without the stale code;
* a **none family** (how an uninformed agent is told it knows nothing), including an empty note and
  no note line at all;
* **distractor notes**: an uninformed agent's note may carry a number that is not the answer;
* a **header family** for each note line, so the header is no cue to who is informed;
* the **team size** (``meta["agents"]``) and the **informed set** (0, 1 or 2 agents);
* the note **before or after** the question.

Held-out (``test``) items use fact, none, distractor, header and question families and team sizes
that no training item has (:data:`DESIGN`, also recorded in the benchmark spec). Items with no
informed agent cannot be answered by anyone (``meta["answerable"]`` is False): there the only
cost-free policy is silence; accuracy targets are meant over answerable items.

Each agent's note line is rendered here, into ``meta["notes"]`` (one entry per agent; None = no
note line), so the MAS prompt (:func:`components.mas.roles.user_prompt`) only places it. Generated,
not downloaded: the same seed gives the same bytes (``GENERATOR_VERSION`` is the manifest's source).
"""

from __future__ import annotations

import random
from typing import Any

GENERATOR_VERSION = "splitinfo-v2"
BENCHMARK = "splitinfo2"
COUNTS = {"train": 2000, "test": 400}

_FACTS = {  # family -> template of the informed note's text ({obj}, {new}, {old})
    # training: 2 x 2 x 2 = value first/last x sentence/log line x with/without the stale code
    "sentence_new_last": "The new {obj} code is {new}.",
    "sentence_new_first": "{new} is the new code for the {obj}.",
    "sentence_stale_new_last": "The {obj} code was changed from {old} to {new}.",
    "sentence_stale_new_first": "{new} replaced {old} as the {obj} code.",
    "log_new_last": "[log] {obj} code set: {new}",
    "log_new_first": "{new} <- {obj} code (reset)",
    "log_stale_new_last": "{obj}: code {old} -> {new}",
    "log_stale_new_first": "{new} (was {old}) {obj} code",
    # held out
    "quote_new_last": 'The caretaker told you: "From now on the {obj} opens with {new}."',
    "quote_stale_new_first": 'Text message: "{new}, not {old}, for the {obj}."',
    "table_stale_new_last": "{obj} | old: {old} | current: {new}",
    "record_new_first": "code={new}; device={obj}; status=active",
}
_NONE = {  # family -> the note text of an agent told nothing (None: no note line at all)
    "none_v1": "none (another agent may have been given one).",
    "told_nothing": "you were told nothing about this.",
    "empty": "",
    "missing": None,
    # held out
    "no_information": "(no private information was given to you)",
    "dash": "-",
    "not_informed": "nobody told you the current code.",
}
_DISTRACTORS = {  # family -> note text carrying a number that is not the answer ({obj}, {d})
    "badge": "Your badge number is {d}.",
    "room": "Room {d} is booked for the {obj} inspection.",
    # held out
    "ticket": "Ticket #{d} about the {obj} is still open.",
    "extension": "Call extension {d} if the {obj} jams.",
}
_HEADERS = {  # family -> the note line's label
    "private": "Private note:",
    "private_only_you": "Private note (only you can see it):",
    "note": "Note:",
    # held out
    "your_notes": "Your notes:",
    "memo": "Memo for you alone:",
}
_QUESTIONS = {  # family -> question holding the stale code ({obj}, {old})
    "used_to_be": "The {obj} code used to be {old}, but it was changed. What is the {obj} code now?",
    "last_week": "Last week the {obj} code was {old}. It has since been reset. What is the current {obj} code?",
    "old_code": "The old code for the {obj} was {old}. Which code opens the {obj} today?",
    "remembers": "Everyone remembers the {obj} code as {old}, but it changed this morning. What is the {obj} code?",
    # held out
    "until_yesterday": "The {obj} had the code {old} until yesterday, when it was replaced. What is the code now?",
    "sign": "A sign still says the {obj} code is {old}, but the sign is out of date. What is the real {obj} code?",
    "before_update": "Before the update the {obj} used code {old}. What code does the {obj} use after the update?",
}
_OBJECTS = {
    "train": ["locker", "vault", "gate", "safe", "garage", "alarm", "bike lock", "server room", "storage unit",
              "mailbox", "office door", "cabinet", "wifi router", "back door", "shed", "briefcase", "tool chest",
              "side entrance", "file room", "boat cabin"],
    "test": ["warehouse", "lab door", "gym locker", "studio", "supply closet", "basement", "roof hatch",
             "garden gate", "archive", "loading dock", "kiosk", "workshop"],
}
_NEW_CODES = {"train": (1000, 5499), "test": (5500, 9999)}
INFORMED_WEIGHTS = {0: 0.15, 1: 0.6, 2: 0.25}
"""how many agents of a team hold the fact (capped at the team size)"""
DISTRACTOR_P = 0.3
"""chance that an uninformed agent's note carries a distracting number instead of saying nothing"""

DESIGN: dict[str, dict[str, tuple[Any, ...]]] = {
    "train": {
        "fact": tuple(list(_FACTS)[:8]),
        "none": tuple(list(_NONE)[:4]),
        "distractor": ("badge", "room"),
        "header": ("private", "private_only_you", "note"),
        "question": tuple(list(_QUESTIONS)[:4]),
        "team_size": (2, 3, 5),
    },
    "test": {
        "fact": tuple(list(_FACTS)[8:]),
        "none": tuple(list(_NONE)[4:]),
        "distractor": ("ticket", "extension"),
        "header": ("your_notes", "memo"),
        "question": tuple(list(_QUESTIONS)[4:]),
        "team_size": (4, 6),
    },
}
"""split -> axis -> the families (or team sizes) its items draw from; train and test are disjoint on
every axis (tests/unit/data/test_data_splitinfo_v2.py). The benchmark spec records it too."""
MAX_TEAM = max(max(d["team_size"]) for d in DESIGN.values())
"""the largest team of any item: ``mas.agents`` must be at least this to play every item"""


def _note_line(header: str, text: str | None) -> str | None:
    if text is None:
        return None
    return f"{header} {text}".rstrip()


def _number(rng: random.Random, low: int, high: int, avoid: set[int]) -> int:
    value = rng.randint(low, high)
    while value in avoid:
        value = rng.randint(low, high)
    return value


def _item(rng: random.Random, split: str, i: int) -> dict[str, Any]:
    design = DESIGN[split]
    low, high = _NEW_CODES[split]
    obj = rng.choice(_OBJECTS[split])
    families = {axis: rng.choice(design[axis]) for axis in ("fact", "none", "distractor", "question")}
    team = rng.choice(design["team_size"])
    n_informed = min(team, rng.choices(list(INFORMED_WEIGHTS), weights=list(INFORMED_WEIGHTS.values()))[0])
    informed = sorted(rng.sample(range(team), n_informed))
    new = rng.randint(low, high)
    old = _number(rng, 1000, 9999, {new})
    fact = _FACTS[families["fact"]].format(obj=obj, new=new, old=old)
    notes: list[str | None] = []
    kinds: list[str] = []
    headers: list[str] = []
    distractors: list[str] = []
    for agent in range(team):
        headers.append(rng.choice(design["header"]))
        header = _HEADERS[headers[-1]]
        if agent in informed:
            notes.append(_note_line(header, fact))
            kinds.append("fact")
        elif rng.random() < DISTRACTOR_P:
            d = _number(rng, low, high, {new, old})
            distractors.append(str(d))
            notes.append(_note_line(header, _DISTRACTORS[families["distractor"]].format(obj=obj, d=d)))
            kinds.append("distractor")
        else:
            notes.append(_note_line(header, _NONE[families["none"]]))
            kinds.append("none")
    if not distractors:
        families["distractor"] = None
    return {"id": f"{BENCHMARK}/{split}/{i}", "benchmark": BENCHMARK, "split": split,
            "question": _QUESTIONS[families["question"]].format(obj=obj, old=old), "choices": None,
            "answer": str(new), "answer_type": "numeric",
            "meta": {"generator": GENERATOR_VERSION, "private": fact, "stale_answer": str(old), "object": obj,
                     "family": families["fact"], "families": families, "agents": team, "informed": informed,
                     "answerable": bool(informed), "notes": notes, "note_kinds": kinds, "headers": headers,
                     "distractor": bool(distractors), "distractor_values": distractors,
                     "note_first": rng.random() < 0.5}}


def generate_split(split: str, n: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` (default :data:`COUNTS`) normalised records of ``split``, deterministic in ``seed``."""
    if split not in DESIGN:
        raise ValueError(f"splitinfo2: unknown split {split!r} (splits: {', '.join(DESIGN)})")
    rng = random.Random(f"{GENERATOR_VERSION}:{split}:{seed}")
    return [_item(rng, split, i) for i in range(COUNTS[split] if n is None else n)]


def generate() -> dict[str, list[dict[str, Any]]]:
    """Every split (the "source" of ``agent-gspo prepare --benchmarks splitinfo2``)."""
    return {split: generate_split(split) for split in COUNTS}
