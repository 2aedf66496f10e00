"""Where the agents fell silent: the silence tables of ``docs/results.md``.

Three views, each from the committed results files only:

* held out, per agent and round (``ResultsFile.silence``): who went quiet, and when;
* held out, per benchmark (the evaluation cells): on which kind of question;
* in training, per agent and round over the last k steps (``silence/agent<a>_round<r>`` in the
  history), next to the first step's: what the policy learned from where it started.

The ``prior only`` row (silence prior, no RL) is the reference: silence beyond it is learned.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from components.evaluation.runner import MAS_SYSTEMS
from experiments.report_collapse import Row
from experiments.results import ResultsFile, SilenceCounts

_SLOT = re.compile(r"^silence/agent(\d+)_round(\d+)$")


def _ran(rows: Sequence[Row]) -> list[Row]:
    return [r for r in rows if r.cells is not None and r.system in MAS_SYSTEMS]


def _rate(silent: int, sent: int) -> str:
    return f"{silent / sent:.2f} ({sent})" if sent else "- (0)"


def _grid_cells(g: SilenceCounts, slots: list[tuple[int, int]]) -> list[str]:
    cells = []
    for a, r in slots:
        sent = g.sent[a][r] if a < len(g.sent) and r < len(g.sent[a]) else 0
        cells.append(_rate(g.silent[a][r] if sent else 0, sent))
    return [*cells, _rate(sum(map(sum, g.silent)), sum(map(sum, g.sent)))]


def held_out_silence(rows: Sequence[Row]) -> list[str]:
    """Held-out silence per agent and round of every multi-agent row that ran ([] when no file
    recorded it)."""
    mas = _ran(rows)
    shaped = [r.silence for r in mas if r.silence is not None]
    if not shaped:
        return []
    agents = max(len(g.sent) for g in shaped)
    rounds = max(len(row) for g in shaped for row in g.sent)
    slots = [(a, r) for a in range(agents) for r in range(rounds)]
    out = ["## Held-out silence per agent and round", "",
           "Silent messages / messages sent (in brackets) per agent and round, over all evaluated items. A call "
           "the protocol skipped (the agent fell silent in an earlier round) is not a message. The `prior only` "
           "row is the silence the prior alone injects; a trained policy's silence beyond it is learned. ('-': "
           "not recorded in that file.)", "",
           "| System | experiment | " + " | ".join(f"agent {a} round {r}" for a, r in slots) + " | all |",
           "|---|---|" + "---|" * (len(slots) + 1)]
    for row in mas:
        cells = ["-"] * (len(slots) + 1) if row.silence is None else _grid_cells(row.silence, slots)
        out.append(f"| {row.label} | {row.experiment} | " + " | ".join(cells) + " |")
    return [*out, ""]


def silence_by_benchmark(rows: Sequence[Row], benches: Sequence[str]) -> list[str]:
    """Held-out silence rate and calls skipped per item, per benchmark, of every multi-agent row."""
    mas = _ran(rows)
    if not mas:
        return []
    out = ["## Held-out silence per benchmark", "",
           "Cells: silence rate (silent / sent messages) / calls skipped per item (agent turns the protocol did "
           "not prompt). Where a policy falls silent says what it learned to abstain on.", "",
           "| System | experiment | " + " | ".join(benches) + " |", "|---|---|" + "---|" * len(benches)]
    for row in mas:
        cells = row.cells or {}
        out.append(f"| {row.label} | {row.experiment} | " + " | ".join(
            f"{cells[b].silence_rate:.2f} / {cells[b].calls_skipped:.2f}" if b in cells else "-" for b in benches)
            + " |")
    return [*out, ""]


def training_silence(results: Mapping[str, ResultsFile]) -> list[str]:
    """Training silence per agent and round, mean of the last k steps (first step in brackets), of
    every trained experiment that logged it."""
    logged = {n: r for n, r in results.items() if any(_SLOT.match(k) for row in r.history for k in row)}
    if not logged:
        return []
    slots = sorted({(int(m[1]), int(m[2])) for r in logged.values() for row in r.history for k in row
                    if (m := _SLOT.match(k))})
    out = ["### Training silence per agent and round (last k steps)", "",
           "Share of sampled training messages that were silent, mean over the last k steps that sent a message "
           "in that slot (k as in the table above; 'no messages': every agent had fallen silent before that "
           "round in the last k steps); first step in brackets.", "",
           "| experiment | " + " | ".join(f"agent {a} round {r}" for a, r in slots) + " |",
           "|---|" + "---|" * len(slots)]
    for name, res in logged.items():
        h, k = res.history, min(res.last_k, len(res.history))
        cells = []
        for a, r in slots:
            key = f"silence/agent{a}_round{r}"
            last = [row[key] for row in h[-k:] if key in row]  # a step logs a slot only if it sent a message
            first = f"{h[0][key]:.2f}" if key in h[0] else "-"
            cells.append(f"{sum(last) / len(last):.2f} ({first})" if last else f"no messages ({first})")
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return [*out, ""]
