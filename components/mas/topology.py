"""Communication topologies: who hears whom, and in which order agents of a round speak.

``adj[i][j] == 1`` means agent i's messages are delivered to agent j (sender row, receiver column,
as ``mas.adjacency`` in params.yaml). Semantics shared with the engine:

* cyclic topologies (complete, star, debate, cyclic custom) are *simultaneous*: all agents of a round
  speak in one batched call and see only in-neighbours' messages from earlier rounds;
* DAG topologies (chain, layered, acyclic custom; self-loops ignored) are *sequential* inside a
  round: agents are grouped into waves (longest-path levels), each wave is one batched call and
  sees in-neighbours' messages from earlier waves of the same round as well as earlier rounds.

Named topologies (n agents):
  complete  every ordered pair i != j (free-for-all);
  chain     i -> i+1;
  star      hub 0 <-> every other agent (bidirectional, hence simultaneous);
  layered   first layer agents [0, ceil(n/2)) -> every agent of the second layer;
  debate    complete plus self-loops: as in multi-agent debate, each agent re-reads every answer of
            the previous rounds including its own; never same-round messages;
  custom    the given matrix.
"""

from __future__ import annotations

from components.errors import UserError

TOPOLOGIES = ("complete", "chain", "star", "layered", "debate", "custom")


class TopologyError(UserError):
    """A topology name or adjacency matrix that cannot be used."""


def build_adjacency(name: str, n: int, custom: list[list[int]] | None = None) -> list[list[int]]:
    """n x n 0/1 matrix [sender][receiver] for a named topology (see module docstring)."""
    if n < 1:
        raise TopologyError(f"topology {name!r}: need at least one agent, got n={n}")
    if name == "custom":
        if custom is None or len(custom) != n or any(len(row) != n for row in custom):
            raise TopologyError(f"topology 'custom': mas.adjacency must be a {n}x{n} matrix, got {custom!r}")
        bad = [(i, j) for i in range(n) for j in range(n) if custom[i][j] not in (0, 1)]
        if bad:
            raise TopologyError(f"topology 'custom': mas.adjacency[{bad[0][0]}][{bad[0][1]}] must be 0 or 1")
        return [[int(v) for v in row] for row in custom]
    adj = [[0] * n for _ in range(n)]
    if name == "complete":
        for i in range(n):
            for j in range(n):
                adj[i][j] = int(i != j)
    elif name == "debate":
        adj = [[1] * n for _ in range(n)]
    elif name == "chain":
        for i in range(n - 1):
            adj[i][i + 1] = 1
    elif name == "star":
        for j in range(1, n):
            adj[0][j] = adj[j][0] = 1
    elif name == "layered":
        first = (n + 1) // 2
        for i in range(first):
            for j in range(first, n):
                adj[i][j] = 1
    else:
        raise TopologyError(f"unknown topology {name!r} (allowed: {', '.join(TOPOLOGIES)})")
    return adj


def in_neighbours(adj: list[list[int]], j: int) -> list[int]:
    """Senders whose messages agent j receives (self included when adj[j][j] == 1)."""
    return [i for i in range(len(adj)) if adj[i][j]]


def out_neighbours(adj: list[list[int]], i: int) -> list[int]:
    """Receivers of agent i's messages."""
    return [j for j in range(len(adj)) if adj[i][j]]


def is_dag(adj: list[list[int]], *, ignore_self_loops: bool = True) -> bool:
    """True when the graph has no directed cycle (self-loops ignored by default: an agent's own
    message of the current round does not exist before it speaks, so it cannot order a round)."""
    n = len(adj)
    if not ignore_self_loops and any(adj[i][i] for i in range(n)):
        return False
    return waves_or_none(adj) is not None


def waves_or_none(adj: list[list[int]]) -> list[list[int]] | None:
    """Kahn levels (longest path from a source) ignoring self-loops, or None when cyclic."""
    n = len(adj)
    indeg = [sum(adj[i][j] for i in range(n) if i != j) for j in range(n)]
    level = [0] * n
    ready = [j for j in range(n) if indeg[j] == 0]
    seen = 0
    while ready:
        i = ready.pop(0)
        seen += 1
        for j in range(n):
            if j != i and adj[i][j]:
                level[j] = max(level[j], level[i] + 1)
                indeg[j] -= 1
                if indeg[j] == 0:
                    ready.append(j)
    if seen < n:
        return None
    return [[j for j in range(n) if level[j] == lv] for lv in range(max(level) + 1)]


def round_waves(adj: list[list[int]]) -> list[list[int]]:
    """Agents of one round grouped into batched calls, in speaking order.

    DAG: its levels (agent lists ascending). Cyclic: one wave with every agent (simultaneous).
    """
    waves = waves_or_none(adj)
    return waves if waves is not None else [list(range(len(adj)))]
