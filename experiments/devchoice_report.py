"""Report of a recipe chosen on dev items and judged once on the test items (``devchoice1``, issue 52).

Inputs, all plain files that runs wrote:

* ``--dev``: a folder with the two candidates' dev-set results files (``<name>.json``, written by
  ``experiments run --set experiments.eval_split=devset``);
* ``--test``: a folder that holds, once it has run, the chosen candidate's test results file and
  nothing of the other (a test file of the candidate not chosen means the test items were touched
  by a recipe the rule did not pick: refused);
* ``--baselines``: the baselines file of the same test items and settings (the untrained team,
  single-agent CoT and self-consistency), here ``results/cap128/baselines.json``.

The choice (:mod:`experiments.devchoice`, a named selection rule) is printed with its numbers; the
test touch is judged by a named verdict rule version (v2 or later): the pre-registered predictions
P1 (total tokens at most ``target_share`` of the untrained team's), P2 (non-inferior at ``ni_margin``),
P3 (single-agent CoT has more correct answers per 1,000 tokens) and P4 (agents 1 and 2 collapsed,
silent before any answer on >= ``silence_collapse_share`` of their round-0 turns, on at least
``COLLAPSE_BENCHMARKS`` benchmarks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from components.io import write_text_atomic
from components.plotting import Point, plot_accuracy_vs_tokens
from experiments.definitions import settings_diff
from experiments.devchoice import Choice, DevChoiceError, choose
from experiments.evidence import BASELINES, MAIN, UNTRAINED
from experiments.report import devset_line
from experiments.report_collapse import collapse_lines, collapsed_agents, content_lines
from experiments.report_single import SINGLE, Cost, cost
from experiments.results import EvalCell, ResultsFile, json_files, load_results
from experiments.rules import VerdictRulesV2, rules_block, rules_of, selection_block, selection_of
from experiments.verdicts import chance_section, is_v2, ni_line, ni_test

COLLAPSE_BENCHMARKS = 5
"""P4 as pre-registered for devchoice1: a collapse of agents 1 and 2 on at least this many benchmarks"""
COLLAPSING_AGENTS = (1, 2)


@dataclass(frozen=True)
class _Row:
    """One system of the test table (fits :class:`experiments.verdicts.ChanceRow`)."""

    experiment: str
    label: str
    cells: dict[str, EvalCell]


def _folder(folder: Path, what: str) -> dict[str, tuple[ResultsFile, str]]:
    if not folder.is_dir():
        raise DevChoiceError(f"{what} {folder}: not a folder")
    return {p.stem: (load_results(p), str(p)) for p in json_files(folder)}


def _test_file(test_dir: Path, choice: Choice) -> tuple[ResultsFile, str] | None:
    files = _folder(test_dir, "--test") if test_dir.exists() else {}
    other = choice.b.name if choice.chosen == choice.a.name else choice.a.name
    if other in files:
        raise DevChoiceError(f"{files[other][1]}: the candidate the rule did not choose ({other}) touched the test "
                             "items; only the chosen one may")
    extra = sorted(set(files) - {choice.chosen})
    if extra:
        raise DevChoiceError(f"--test {test_dir}: files of no candidate ({', '.join(extra)}.json)")
    return files.get(choice.chosen)


def _check_test(test: ResultsFile, where: str, base: ResultsFile, base_where: str, dev: ResultsFile) -> None:
    if test.eval_split != "test":
        raise DevChoiceError(f"{where}: evaluated on {test.eval_split!r}; the test touch plays the test sample")
    if test.item_ids_sha256 != base.item_ids_sha256:
        raise DevChoiceError(f"{where} and {base_where}: other items (item_ids_sha256 {test.item_ids_sha256[:12]}… "
                             f"vs {base.item_ids_sha256[:12]}…)")
    diff = settings_diff(test.settings, base.settings)
    if diff:
        raise DevChoiceError(f"{where} and {base_where}: settings differ ({'; '.join(diff)})")
    if test.trained_model != dev.trained_model or test.seed != dev.seed:
        raise DevChoiceError(f"{where}: model {test.trained_model} (seed {test.seed}) is not the one chosen on the dev "
                             f"items ({dev.trained_model}, seed {dev.seed})")


def _fmt_row(c: Cost, ref: Cost) -> str:
    return (f"| {c.label} | {c.accuracy:.3f} | {c.accuracy - ref.accuracy:+.3f} | {c.tokens_per_item:.1f} "
            f"({c.tokens_per_item / ref.tokens_per_item:.2f}x) | {c.per_1k:.3f} |")


def _collapsed_benchmarks(test: ResultsFile, rules: VerdictRulesV2) -> list[str] | None:
    silence = (test.silence or {}).get(MAIN)
    if silence is None or not silence.by_benchmark:
        return None
    return [b for b, grid in silence.by_benchmark.items()
            if set(COLLAPSING_AGENTS) <= {a for a, _ in collapsed_agents(grid, rules.silence_collapse_share)}]


def _choice_lines(choice: Choice, dev: Mapping[str, tuple[ResultsFile, str]]) -> list[str]:
    first = dev[choice.a.name][0]
    benches = list(choice.a.items)
    out = ["## The choice on the dev items", ""]
    if first.devset is not None:
        out += [devset_line(first.devset, first.item_ids_sha256), ""]
    out += ["| candidate | macro accuracy | total tokens / item (macro) | " + " | ".join(benches) + " |",
            "|---|---|---|" + "---|" * len(benches)]
    for c in (choice.a, choice.b):
        accs = " | ".join(f"{sum(col.correct)}/{len(col.correct)}" for col in c.items.values())
        out.append(f"| {c.name} | {c.accuracy:.3f} | {c.tokens_per_item:.1f} | {accs} |")
    return [*out, "", f"**Chosen: {choice.chosen}**: {choice.reason}.", ""]


def _test_lines(choice: Choice, test: ResultsFile, base: ResultsFile, rules: VerdictRulesV2,
                png: Path) -> tuple[list[str], dict[str, bool | None]]:
    team_cells = test.eval[MAIN]
    benches = [b for b in team_cells if b in base.eval.get(UNTRAINED, {})]
    ref = cost("untrained team", {b: base.eval[UNTRAINED][b] for b in benches}, benches)
    team = cost(f"{choice.chosen} (chosen)", team_cells, benches)
    singles = [cost(label, {b: base.eval[s][b] for b in benches}, benches)
               for s, label in SINGLE.items() if s in base.eval]
    results = {BASELINES: base, test.name: test}
    ni = ni_test(results, (test.name, MAIN), (BASELINES, UNTRAINED), rules)
    cot = next((c for c in singles if c.label == SINGLE["single_cot"]), None)
    collapsed = _collapsed_benchmarks(test, rules)
    preds: dict[str, bool | None] = {
        "P1 tokens": team.tokens_per_item <= rules.target_share * ref.tokens_per_item,
        "P2 non-inferior": None if ni is None else ni.passed,
        "P3 CoT more accurate per token": None if cot is None else cot.per_1k > team.per_1k,
        "P4 collapse": None if collapsed is None else len(collapsed) >= COLLAPSE_BENCHMARKS}
    out = ["## The test touch", "",
           f"`{test.name}` as chosen, its trained model unchanged (`{test.trained_model}`, training seed {test.seed}), "
           f"played the {sum(c.n for c in team_cells.values())} test items once (item ids sha256 "
           f"`{test.item_ids_sha256[:12]}…`, the items of `{base.name}`); commit `{(test.git_commit or '?')[:7]}`, "
           f"{test.eval_seconds / 60:.0f} min of evaluation.", "",
           "| system | macro accuracy | minus the untrained team's | total tokens / item (x untrained) | "
           "correct per 1,000 tokens |", "|---|---|---|---|---|",
           _fmt_row(team, ref), _fmt_row(ref, ref), *(_fmt_row(c, ref) for c in singles), "",
           "Predictions (pre-registered in docs/experiments-log.md before any candidate trained):", "",
           f"- P1, total tokens ≤ {rules.target_share:g}x the untrained team's: "
           f"{team.tokens_per_item / ref.tokens_per_item:.2f}x",
           f"- P2, {ni_line('the chosen team against the untrained team', ni, ref.accuracy)}",
           "- P3, single-agent CoT has more correct answers per 1,000 tokens: "
           + ("n/a (no CoT in the baselines file)" if cot is None
              else f"CoT {cot.per_1k:.3f} vs team {team.per_1k:.3f}"),
           "- P4, agents 1 and 2 collapsed on ≥ "
           f"{COLLAPSE_BENCHMARKS} of {len(benches)} benchmarks: "
           + ("n/a (no per-benchmark silence in the file)" if collapsed is None
              else f"{len(collapsed)} ({', '.join(collapsed) or 'none'})"), ""]
    out += [f"- {k}: **{'n/a' if v is None else ('holds' if v else 'wrong')}**" for k, v in preds.items()]
    silence = (test.silence or {}).get(MAIN)
    out += ["", "Collapse per benchmark: " + "; ".join(collapse_lines(silence, rules, len(benches))), "",
            *(f"- {line}" for line in content_lines(silence)), ""]
    rows = [_Row(test.name, team.label, team_cells), _Row(BASELINES, "untrained team", base.eval[UNTRAINED]),
            *(_Row(BASELINES, label, base.eval[s]) for s, label in SINGLE.items() if s in base.eval)]
    out += chance_section(rows, benches, rules)
    points = [Point(r.label, b, r.cells[b].tokens_total_mean, r.cells[b].accuracy, r.cells[b].accuracy_se, r.cells[b].n)
              for r in rows for b in benches if b in r.cells]
    plot_accuracy_vs_tokens(points, png, title=f"Test items: {choice.chosen} (chosen on dev) and the baselines")
    out += [f"![accuracy vs tokens]({png.parent.name}/{png.name})", ""]
    return out, preds


@dataclass(frozen=True)
class DevChoiceInputs:
    """What the report reads (the module docstring says what each is)."""

    dev: Path
    test: Path
    baselines: Path
    candidates: tuple[str, str]
    """in the registered order (a, b): the tie-break picks a on exactly equal tokens"""
    selection: str
    """selection rule version (experiments.rules.SELECTIONS)"""
    rules: str
    """verdict rule version that judges the test touch (v2 or later)"""


def build_devchoice_report(inputs: DevChoiceInputs, out: Path, command: str) -> dict[str, bool | None]:
    """Write the report to ``out`` (a PNG in ``<out stem>/`` beside it once the test touch exists);
    returns the predictions' outcomes (empty before the test touch)."""
    dev_dir, test_dir, baselines, order = inputs.dev, inputs.test, inputs.baselines, inputs.candidates
    selection, rules_version = inputs.selection, inputs.rules
    rule, rules = selection_of(selection), rules_of(rules_version)
    if not is_v2(rules):
        raise DevChoiceError(f"--rules {rules_version}: the test touch is judged by v2 or later (non-inferiority)")
    dev = _folder(dev_dir, "--dev")
    choice = choose({n: f for n, (f, _) in dev.items()}, order, rule, {n: w for n, (_, w) in dev.items()})
    base = load_results(baselines)
    lines = [f"# A recipe chosen on dev items, judged once on the test items ({test_dir})", "",
             f"Generated by `{command}` from the dev-set files in `{dev_dir}`, the test file in `{test_dir}` and "
             f"`{baselines}`. Candidates in the pre-registered order: {order[0]}, {order[1]}.", "",
             *selection_block(selection), *rules_block(rules_version, source="--rules"), *_choice_lines(choice, dev)]
    found = _test_file(test_dir, choice)
    preds: dict[str, bool | None] = {}
    if found is None:
        lines += ["## The test touch", "", f"Not run yet: no `{choice.chosen}.json` in `{test_dir}`.", ""]
    else:
        test, where = found
        _check_test(test, where, base, str(baselines), dev[choice.chosen][0])
        png = out.parent / out.stem / "accuracy_tokens.png"
        png.parent.mkdir(parents=True, exist_ok=True)
        more, preds = _test_lines(choice, test, base, rules, png)
        lines += more
    write_text_atomic(out, "\n".join(lines))
    return preds
