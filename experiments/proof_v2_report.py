"""Report of the proof on the split-information task's second version (``splitinfo2``, issue 52).

Inputs, one results folder (``results/proof_v2``), all plain files that runs wrote:

* ``families*.json`` — ``bench/proof_families.py --out``: every system's greedy play of the same
  held-out items (same id hash, checked), broken down by phrasing family, team size and the rest;
* ``runs/<name>/history.json`` and ``runs/<name>/metrics.json`` — copies of a training run's
  folder (``agent-gspo train``): the per-step history and the budget calibration (B).

Judged by a named verdict rule version (:mod:`experiments.rules`, v2 or later; never "the latest"):
per Agent-GSPO seed, overall and on every held-out fact family, accuracy, silence of the agents
without and with the fact, a distracting number said, and total tokens against the untrained team;
the dual budget over the last ``window`` training episodes per seed, with the token and the turn
cost per step (the reward's two cost terms: λ_tok · tokens / token_norm and λ_turn · turns, from
the logged means, which the terms are linear in).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt

from components.errors import UserError
from components.io import write_text_atomic
from components.plotting import History, save_png, series, step_axis
from experiments.plots import plot_curves, plot_role_silence
from experiments.results import read_json
from experiments.rules import VerdictRules, VerdictRulesV2, rules_block, rules_of
from experiments.stats import Cost, equal_tokens

SINGLE = {"single_cot": "CoT", "self_consistency": "SC"}
"""single-agent systems of bench/proof_families.py --single: one agent holding every fact a team would"""
UNTRAINED = ("mas_untrained", "mas_prior")
"""teams without RL; every other team in the families files was trained"""
TRAINED_PREFIX = "agent_gspo"
"""systems whose name starts with this are the budgeted Agent-GSPO seeds the targets judge"""
FAMILY_AXIS = "family"


class ProofV2Error(UserError):
    """A results folder the report cannot read (missing, mixed items, repeated system)."""


@dataclass(frozen=True)
class Families:
    """Every system's per-axis breakdown on one set of held-out items."""

    systems: dict[str, dict[str, dict[str, dict[str, Any]]]]
    """system -> axis -> group -> numbers (bench/proof_families.py's ``breakdown``)"""
    item_ids_sha256: str
    limit: int


@dataclass(frozen=True)
class TrainingRun:
    history: History
    calibration: Mapping[str, Any] | None


def _families_file(path: Path) -> tuple[str, int, dict[str, Any]]:
    """(id hash, limit, systems) of one ``families*.json``; :class:`ProofV2Error` naming the file and key."""
    record = read_json(path)
    if not isinstance(record, dict):
        raise ProofV2Error(f"{path}: not a bench/proof_families.py --out file (a JSON object expected)")
    for key, kind in (("item_ids_sha256", str), ("limit", int), ("systems", dict)):
        if not isinstance(record.get(key), kind) or isinstance(record.get(key), bool):
            raise ProofV2Error(f"{path}: {key}: missing or not a {kind.__name__}")
    for name, axes in record["systems"].items():
        if not isinstance(axes, dict) or not isinstance(axes.get("all", {}).get("all"), dict):
            raise ProofV2Error(f"{path}: systems.{name}: no all.all numbers (bench/proof_families.py breakdown)")
    return record["item_ids_sha256"], record["limit"], record["systems"]


def load_families(folder: Path) -> Families:
    """Merge ``folder/families*.json``; every file must cover the same items, each system once."""
    files = sorted(folder.glob("families*.json"))
    if not files:
        raise ProofV2Error(f"{folder}: no families*.json (bench/proof_families.py --out) to report")
    systems: dict[str, Any] = {}
    hashes: set[str] = set()
    limit = 0
    for path in files:
        ids, limit, found = _families_file(path)
        hashes.add(ids)
        for name, numbers in found.items():
            if name in systems:
                raise ProofV2Error(f"{path}: system {name!r} is also in another families file")
            systems[name] = numbers
    if len(hashes) != 1:
        raise ProofV2Error(f"{folder}: the families files played different items (id hashes {sorted(hashes)})")
    return Families(systems, hashes.pop(), limit)


def load_runs(folder: Path) -> dict[str, TrainingRun]:
    """``folder/runs/<name>/{history,metrics}.json`` by run name (empty when none were copied)."""
    out = {}
    for run in sorted(p for p in (folder / "runs").glob("*") if p.is_dir()):
        history = read_json(run / "history.json")
        if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
            raise ProofV2Error(f"{run / 'history.json'}: not a training history (a list of per-step objects)")
        metrics = read_json(run / "metrics.json") if (run / "metrics.json").is_file() else {}
        calibration = metrics.get("budget_calibration") if isinstance(metrics, dict) else None
        if calibration is not None and not (isinstance(calibration, dict)
                                            and isinstance(calibration.get("target"), int | float)):
            raise ProofV2Error(f"{run / 'metrics.json'}: budget_calibration.target: missing or not a number")
        out[run.name] = TrainingRun(history, calibration)
    return out


def _check(value: float | None, bound: float, *, at_least: bool) -> str:
    if value is None:
        return "n/a"
    ok = value >= bound if at_least else value <= bound
    return f"{value:.2f} {'✓' if ok else '✗'}"


def target_table(fam: Families, rules: VerdictRulesV2) -> tuple[list[str], dict[str, bool]]:
    """Rows per Agent-GSPO seed and group (``all`` and each fact family), and PASS per seed."""
    head = ("| system | group | items | accuracy | silence without fact | silence with fact | distractor said "
            "| tokens vs untrained |")
    lines = [head, "|---" * 8 + "|"]
    passed: dict[str, bool] = {}
    untrained = fam.systems.get("mas_untrained", {})
    for name, axes in fam.systems.items():
        groups = [("all", axes["all"]["all"])] + sorted(axes.get(FAMILY_AXIS, {}).items())
        ok = name.startswith(TRAINED_PREFIX)
        for group, n in groups:
            base = untrained.get("all" if group == "all" else FAMILY_AXIS, {}).get(group, {}).get("tokens_total")
            ratio = round(n["tokens_total"] / base, 3) if base else None
            cells = [_check(n["accuracy"], rules.proof_accuracy, at_least=True),
                     _check(n["silence_uninformed"], rules.proof_silent_uninformed, at_least=True),
                     _check(n["silence_informed"], rules.proof_speaking_informed, at_least=False),
                     _check(n["distractor_said"], rules.proof_distractor, at_least=False),
                     _check(ratio, rules.proof_token_share, at_least=False)]
            lines.append(f"| {name} | {group} | {n['items']} | " + " | ".join(cells) + " |")
            ok = ok and not any(c.endswith("✗") for c in cells)
        if name.startswith(TRAINED_PREFIX):
            passed[name] = ok
    return lines, passed


@dataclass(frozen=True)
class BudgetCheck:
    mean: float | None
    target: float
    episodes: int
    within: bool


def budget_check(run: TrainingRun, rules: VerdictRules, episodes_per_step: int) -> BudgetCheck | None:
    """Mean budget-measure tokens over the last ``rules.window`` training episodes against B."""
    if not run.calibration:
        return None
    target = float(run.calibration["target"])
    steps = -(-rules.window // episodes_per_step)
    values = [h["train/budget_tokens"] for h in run.history if "train/budget_tokens" in h][-steps:]
    if len(values) < steps:
        return BudgetCheck(None, target, len(values) * episodes_per_step, False)
    mean = sum(values) / len(values)
    return BudgetCheck(mean, target, steps * episodes_per_step, abs(mean - target) <= rules.proof_band * target)


@dataclass(frozen=True)
class BandReach:
    """How reachable the ±band was for a run's token use, measured on its second half.

    ``spread`` is the standard deviation of the per-step mean tokens over the steps after the middle,
    as a share of B (sampling and the policy's drift together: what the run showed, not what a better
    dual could reach); ``window_spread`` = spread / sqrt(steps per window), the spread of a window mean
    if steps were independent. ``chance`` = P(|window mean / B − 1| ≤ band) for a window whose expected mean
    sits exactly on B (a perfect dual), under a normal approximation; ``episodes_needed`` is the window
    that would give that chance ``share`` (the share of seeds the rule asks for) at this spread.
    """

    windows_inside: int
    windows: int
    spread: float
    window_spread: float
    chance: float
    episodes_needed: int


def band_reach(run: TrainingRun, rules: VerdictRules, episodes_per_step: int) -> BandReach | None:
    """:class:`BandReach` of ``run`` (None without a calibration or with fewer than two windows' steps)."""
    if not run.calibration:
        return None
    target = float(run.calibration["target"])
    values = [h["train/budget_tokens"] for h in run.history if "train/budget_tokens" in h]
    half, steps = values[len(values) // 2:], -(-rules.window // episodes_per_step)
    if len(half) < max(2, steps):
        return None
    means = [sum(half[i:i + steps]) / steps for i in range(len(half) - steps + 1)]
    inside = sum(abs(m - target) <= rules.proof_band * target for m in means)
    spread = statistics.stdev(half) / target
    window_spread = spread / math.sqrt(steps)
    normal = statistics.NormalDist()
    chance = 2 * normal.cdf(rules.proof_band / window_spread) - 1 if window_spread > 0 else 1.0
    z = normal.inv_cdf(0.5 + rules.proof_seed_share / 2)
    needed = math.ceil(steps * episodes_per_step * (window_spread * z / rules.proof_band) ** 2)
    return BandReach(inside, len(means), spread, window_spread, chance, needed)


def cost_split(history: History, token_norm: float, lambda_turn: float) -> list[dict[str, float]]:
    """Per step: λ_tok used, mean tokens, the token cost λ·tokens/token_norm and the turn cost λ_turn·turns."""
    return [{"step": h["step"], "lambda_tok": h["train/lambda_tok"], "tokens": h["train/budget_tokens"],
             "token_cost": h["train/lambda_tok"] * h["train/budget_tokens"] / token_norm,
             "turn_cost": lambda_turn * h["train/turns"]}
            for h in history if {"train/lambda_tok", "train/budget_tokens", "train/turns"} <= h.keys()]


def plot_costs(splits: Mapping[str, list[dict[str, float]]], path: Path) -> Path:
    """Token cost and turn cost per step, one panel per run."""
    names = list(splits) or ["-"]
    fig, axes = plt.subplots(1, len(names), figsize=(4.6 * len(names), 3.3), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        rows = splits.get(name, [])
        for key, label in (("token_cost", "token cost λ_tok·tokens/norm"), ("turn_cost", "turn cost λ_turn·turns")):
            ax.plot(*series(rows, key), marker=".", label=label)
        ax.set_title(name)
        step_axis(ax, "mean cost per episode")
    fig.suptitle("The reward's two cost terms per training step")
    fig.tight_layout()
    return save_png(fig, path)


def single_agent_lines(fam: Families) -> list[str]:
    """Every team beside one agent at equal tokens (accuracy, total tokens per episode, accuracy per 1,000
    tokens over all held-out items), and the plain answer; [] without a single-agent system."""
    def cost(name: str) -> Cost:
        n = fam.systems[name]["all"]["all"]
        return Cost(SINGLE.get(name, name), n["accuracy"] or 0.0, n["tokens_total"])

    singles = [cost(s) for s in SINGLE if s in fam.systems]
    teams = [cost(s) for s in fam.systems if s not in SINGLE]
    if not singles or not teams:
        return []
    lines = ["## Every team against one agent at equal tokens", "",
             "One agent: the base model alone, reading the note of the team's first informed agent (it holds the "
             "fact whenever any team member does); CoT greedy, SC a majority over `eval.self_consistency_k` samples. "
             "Cells: accuracy / total tokens per episode / accuracy per 1,000 tokens. Equal tokens: the single agent "
             "closest to the team's tokens, not below them where one is not.", "",
             "| system | team | " + " | ".join(s.label for s in singles) + " | equal tokens | accuracy, team − it |",
             "|---" * (4 + len(singles)) + "|"]
    fmt = "{0.accuracy:.3f} / {0.tokens_per_item:.0f} / {0.per_1k:.3f}".format
    for team in teams:
        near = equal_tokens(team, singles)
        ratio = near.tokens_per_item / team.tokens_per_item if team.tokens_per_item else 0.0
        lines.append(f"| {team.label} | {fmt(team)} | " + " | ".join(fmt(s) for s in singles)
                     + f" | {near.label} ({ratio:.2f}x) | {team.accuracy - near.accuracy:+.3f} |")
    best_single = max(singles, key=lambda c: c.per_1k)
    trained = [t for t in teams if t.label not in UNTRAINED]
    best = max(trained or teams, key=lambda c: c.per_1k)
    beats = best.per_1k > best_single.per_1k
    lines += ["", f"**{'A' if beats else 'No'} trained team beats one agent on accuracy per 1,000 tokens**: the best, "
              f"{best.label}, has {best.per_1k:.3f} against {best_single.label} {best_single.per_1k:.3f}.", ""]
    return lines


def build_proof_v2_report(folder: Path, out: Path, rules_version: str, cost_terms: tuple[float, float],
                          episodes_per_step: int) -> dict[str, bool]:
    """Write ``out`` (markdown) and its PNGs beside it; returns each verdict's PASS.

    ``cost_terms`` = (reward.token_norm, reward.lambda_turn) of the budgeted runs' profile.
    """
    rules = rules_of(rules_version)
    if not isinstance(rules, VerdictRulesV2):
        raise ProofV2Error(f"rules {rules_version}: the proof on splitinfo2 is judged by v2 or later "
                           "(its targets are not in v1)")
    fam, runs = load_families(folder), load_runs(folder)
    table, seeds_pass = target_table(fam, rules)
    figs = out.with_suffix("")
    # the registered seeds judge the budget; other budgeted runs (a variant such as training under
    # another turn order) are shown beside them and stay out of the verdict
    budgeted = {n: r for n, r in runs.items() if n.startswith(TRAINED_PREFIX) or r.calibration}
    checks = {n: budget_check(r, rules, episodes_per_step) for n, r in budgeted.items()}
    seeds = {n: c for n, c in checks.items() if n.startswith(TRAINED_PREFIX)}
    held = [n for n, c in seeds.items() if c and c.within]
    budget_ok = bool(seeds) and len(held) / len(seeds) >= rules.proof_seed_share
    splits = {n: cost_split(r.history, *cost_terms) for n, r in budgeted.items()}
    budgets = {n: float(r.calibration["target"]) for n, r in budgeted.items() if r.calibration}
    hist = {n: r.history for n, r in runs.items()}
    pngs = [plot_curves(hist, "train/budget_tokens", figs / "budget.png", ylabel="completion tokens / episode",
                        title="Budget measure per step (dashed: B)", budgets=budgets),
            plot_curves(hist, "train/lambda_tok", figs / "lambda.png", ylabel="λ_tok", title="λ_tok per step"),
            plot_role_silence(hist, figs / "silence.png"), plot_costs(splits, figs / "costs.png")]
    verdicts = {**{f"targets {n}": ok for n, ok in seeds_pass.items()}, "budget": budget_ok}
    lines = [f"# The proof on the split-information task, second version ({folder})", "",
             "Generated by `python -m experiments proof-report`; numbers from bench/proof_families.py "
             f"(greedy, {fam.limit} held-out items, id hash `{fam.item_ids_sha256[:12]}…`) and the training runs' "
             "histories. Targets per Agent-GSPO seed, overall and on every held-out fact family (✓ met, ✗ not).", "",
             *rules_block(rules_version, source="--rules"), "## Targets", "", *table, "",
             *(f"- {k}: **{'PASS' if v else 'FAIL'}**" for k, v in verdicts.items()), "",
             f"## Budget (last {rules.window} training episodes, ±{rules.proof_band:.0%} of B, "
             f"in ≥ {rules.proof_seed_share:.0%} of seeds)", ""]
    for n, c in checks.items():
        last = splits[n][-1] if splits[n] else None
        if c is None:
            lines.append(f"- {n}: no budget (no calibration recorded)")
            continue
        mean = "n/a" if c.mean is None else f"{c.mean:.1f}"
        window = splits[n][-math.ceil(rules.window / episodes_per_step):]
        lams = ", ".join(f"{r['lambda_tok']:+.2f}" for r in window)
        where = (f"; λ_tok over the window {lams}, token cost "
                 f"{sum(r['token_cost'] for r in window) / len(window):.3f} vs turn cost "
                 f"{sum(r['turn_cost'] for r in window) / len(window):.3f} per episode (window means)") if last else ""
        aside = "" if n in seeds else " (not a registered seed: outside the verdict)"
        lines.append(f"- {n}{aside}: mean {mean} vs B {c.target:.1f} over {c.episodes} episodes: "
                     f"{'within' if c.within else 'outside'} the band{where}")
    lines += ["", f"Could any dual have held the band? The second half of each run (the spread of the per-step mean "
              f"tokens as a share of B, sampling and the policy's drift together; a window of {rules.window} episodes; "
              f"the chance is that of a window whose expected mean sits exactly on B, with independent steps at "
              f"this spread):", ""]
    for n, r in budgeted.items():
        reach = band_reach(r, rules, episodes_per_step)
        if reach is not None:
            lines.append(f"- {n}: {reach.windows_inside} of {reach.windows} windows inside the band; step spread "
                         f"{reach.spread:.2f} x B, window {reach.window_spread:.2f} x B: a centred window lands inside "
                         f"with chance {reach.chance:.2f}; a chance of {rules.proof_seed_share:.2f} needs about "
                         f"{reach.episodes_needed:,} episodes per window")
    lines += ["", "Per-step costs of each budgeted run (token | turn):", ""]
    for n, rows in splits.items():
        lines.append(f"- {n}: " + ", ".join(f"{int(r['step'])}: {r['token_cost']:.2f} | {r['turn_cost']:.2f}"
                                             for r in rows))
    lines += ["", *single_agent_lines(fam), "## Does silence depend on what was said?", "",
              "Silence of the agents without the fact, split by whether they had heard an answer before their "
              "turn (bench/proof_families.py `heard_an_answer`). Under the simultaneous order nobody hears an "
              "answer in round 0, so there the split is also round 0 against round 1; under `round0_in_turn` "
              "(the system of that name) later agents hear earlier ones within round 0. Under the adaptive "
              "protocol an agent silent once is retired, so its later turns are never played: a round-1 turn "
              "is always that of an agent that spoke before.", "",
              "| system | silent after an answer | silent before any answer |", "|---|---|---|"]
    for name, axes in fam.systems.items():
        if name in SINGLE:  # a lone solver hears nobody
            continue
        n = axes["all"]["all"]
        cells = ["n/a" if n.get(k) is None else f"{n[k]:.2f}"
                 for k in ("silence_uninformed_heard", "silence_uninformed_unheard")]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    lines += ["", *(f"![{p.stem}]({p.parent.name}/{p.name})" for p in pngs), ""]
    write_text_atomic(out, "\n".join(lines))
    return verdicts
