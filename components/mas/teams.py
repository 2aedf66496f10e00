"""Who plays an episode: the team size and the agents given a split-information item's private fact.

Version-1 split-information items (:mod:`components.data.splitinfo`) play with every agent of the
engine and one holder that rotates over a question's G episodes (:func:`fact_holder`). Items that
fix their own team (:mod:`components.data.splitinfo_v2`) carry its size and informed set in
``meta``; the engine runs them with ``mas.agents`` rows at most and leaves the rest out (padding).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from components.data.item import Item
from components.errors import UserError


class RolloutInputError(UserError):
    """Items or arguments given to the rollout engine that it cannot use."""


def fact_holder(item: Item, group_index: int, n_agents: int) -> int | None:
    """The agent given ``item``'s private fact in episode ``group_index`` (None: no private fact)."""
    if item.private_fact is None:
        return None
    h = int.from_bytes(hashlib.sha256(item.id.encode()).digest()[:4], "big")
    return (h + group_index) % n_agents


@dataclass(frozen=True)
class Seating:
    """Who plays one episode: ``team`` agents (0..team-1), the ``informed`` ones given the private
    fact, and ``note_of[a]``: whose note line agent ``a`` reads (itself, but for lone solvers)."""

    team: int
    informed: frozenset[int]
    note_of: tuple[int, ...]


def episode_team(item: Item, group_index: int, n_agents: int, *, solo: bool = False) -> Seating:
    """The :class:`Seating` of ``item``'s episode ``group_index`` in an engine of ``n_agents``.

    An item with ``meta["agents"]`` fixes its team and informed set (``meta["informed"]``, the same
    in every episode); any other item plays with all ``n_agents`` and :func:`fact_holder` informed.
    ``solo`` engines (single-agent CoT, self-consistency) seat lone solvers: on a team item each one
    reads the note of its first informed agent (so it holds the fact whenever anyone would) or,
    with nobody informed, agent 0's note, as a lone agent on a version-1 item always holds the fact."""
    team = item.meta.get("agents")
    if team is None:
        holder = fact_holder(item, group_index, n_agents)
        return Seating(n_agents, frozenset() if holder is None else frozenset({holder}), tuple(range(n_agents)))
    informed = item.meta.get("informed") or []
    if not isinstance(team, int) or isinstance(team, bool) or not 1 <= team <= (16 if solo else n_agents):
        raise RolloutInputError(f"item {item.id}: meta.agents={team!r} must be a team size in 1..mas.agents="
                                f"{n_agents} (set mas.agents to the largest team of the data)")
    if not all(isinstance(a, int) and 0 <= a < team for a in informed):
        raise RolloutInputError(f"item {item.id}: meta.informed={list(informed)!r} must be agents in 0..{team - 1}")
    notes = item.meta.get("notes")
    if notes is not None and len(notes) != team:
        raise RolloutInputError(f"item {item.id}: meta.notes has {len(notes)} lines for a team of {team}")
    if solo:
        source = min(informed) if informed else 0
        return Seating(n_agents, frozenset(range(n_agents)) if informed else frozenset(), (source,) * n_agents)
    return Seating(team, frozenset(informed), tuple(range(team)))
