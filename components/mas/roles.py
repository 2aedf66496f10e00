"""Role prompts per task family, for N agents sharing one policy.

Agents differ only by their system prompt (one shared policy) and, on split-information items, by
the private note one of them holds. Roles rotate solver / critic / verifier / summariser so any N
works. Every multi-agent prompt says that staying silent is allowed (and costs no communication)
when the agent has nothing useful to add, and how to state the final answer so the grader can read
it. Silence is described in words, never by the silence token itself: the token is the policy's
action (see components.models.silence), and no prompt contains it.
"""

from __future__ import annotations

from components.data.item import Item
from components.errors import UserError

ROLE_CYCLE = ("solver", "critic", "verifier", "summariser")
DECIDER = "decider"
FAMILIES = {"numeric": "maths", "math": "maths", "choice": "choice", "code": "code"}

_ROLE_DUTY = {
    "solver": "Solve the task step by step and give your answer.",
    "critic": "Look for mistakes in the other agents' reasoning; if you find one, correct it and give your answer.",
    "verifier": "Check the proposed answers independently and give the answer you verified.",
    "summariser": "Combine the agents' findings into one short, correct answer.",
    DECIDER: "Read the agents' messages and decide the single final answer.",
}

_ANSWER_FORMAT = {
    "lookup": "Give your answer as 'The answer is X'.",
    "maths": "End with a line 'The answer is X' where X is the final number or expression only.",
    "choice": "End with a line 'The answer is (L)' where L is the letter of the correct option.",
    "code": "Give the complete function in one ```python code block.",
}


class UnknownAnswerTypeError(UserError):
    """An item's answer_type is not one the roles know how to prompt for."""


def item_family(item: Item) -> str:
    """The prompt family of an item: "lookup" for split-information items (one agent holds the
    answer; no reasoning roles), else :func:`task_family` of its answer type."""
    return "lookup" if item.private_fact is not None else task_family(item.answer_type)


def task_family(answer_type: str) -> str:
    """numeric / math -> "maths", choice -> "choice", code -> "code"."""
    try:
        return FAMILIES[answer_type]
    except KeyError:
        raise UnknownAnswerTypeError(
            f"answer_type {answer_type!r} has no role prompt (allowed: {', '.join(FAMILIES)})") from None


def role_names(n: int) -> list[str]:
    """Roles of agents 0..n-1, rotating solver / critic / verifier / summariser."""
    if n < 1:
        raise UserError(f"role_names: need at least one agent, got {n}")
    return [ROLE_CYCLE[i % len(ROLE_CYCLE)] for i in range(n)]


def system_prompt(family: str, role: str, agent_id: int, n_agents: int, *, allow_silence: bool = True) -> str:
    """System prompt of one agent (``agent_id`` is 0-based; shown 1-based)."""
    if family not in _ANSWER_FORMAT:
        raise UserError(f"system_prompt: unknown task family {family!r} (allowed: {', '.join(_ANSWER_FORMAT)})")
    duty = _ROLE_DUTY.get(role, _ROLE_DUTY["solver"])
    if n_agents == 1 and role != DECIDER:
        head = "You are a careful problem solver. Think step by step, briefly."
    elif role == DECIDER:
        head = f"You are the decision agent of a team of {n_agents} agents. {duty}"
    elif family == "lookup":
        head = f"You are agent {agent_id + 1} of {n_agents} in a team that must answer one question."
    else:
        head = f"You are agent {agent_id + 1} of {n_agents}, the {role}. {duty}"
    parts = [head, _ANSWER_FORMAT[family]]
    if allow_silence and n_agents > 1 and role != DECIDER:
        parts.append("If you have nothing useful to add (for example you agree with an answer already given, or you "
                     "do not know), stay silent: a silent reply is not sent to anyone.")
    parts.append("Be concise: every token you write costs.")
    return " ".join(parts)


def user_prompt(item: Item, holds_fact: bool = False, agent: int = 0) -> str:
    """The task text: the question, lettered options for multiple choice, the signature for code.
    Split-information items add the agent's private note: the fact when it ``holds_fact``, else none.
    Items that carry one note line per agent (``meta["notes"]``, :mod:`components.data.splitinfo_v2`)
    give ``agent`` its own line (none when it is None), before the question when ``meta["note_first"]``."""
    family = task_family(item.answer_type)
    notes = item.meta.get("notes")
    if notes is not None:
        question = f"Question: {item.question.rstrip()}"
        line = notes[agent] if agent < len(notes) else None
        if line is None:
            return question
        return f"{line}\n{question}" if item.meta.get("note_first") else f"{question}\n{line}"
    if item.private_fact is not None:
        note = (f"Private note (only you can see it): {item.private_fact}" if holds_fact
                else "Private note: none (another agent may have been given one).")
        return f"Question: {item.question.rstrip()}\n{note}"
    question = item.question.rstrip()
    if family == "choice" and item.choices:
        letters = "ABCDEFGHIJ"
        opts = "\n".join(f"({letters[i]}) {c}" for i, c in enumerate(item.choices))
        return f"Question: {question}\nOptions:\n{opts}"
    if family == "code":
        return f"Complete this Python function:\n```python\n{question}\n```"
    return f"Question: {question}"
