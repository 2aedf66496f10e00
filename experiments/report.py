"""`agent-gspo experiments report`: ``docs/results.md`` + PNGs, a pure function of the results folder.

Nothing here runs a model or reads MLflow: the committed ``results/*.json`` files are the only
input, so anyone can regenerate the report (and review a change to it) from git alone. Missing
experiments appear as "not run" rows and NOT RUN claims, never as invented numbers. The output
has no timestamps: the same results give the same markdown.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from components.config import BENCHMARKS
from components.io import write_text_atomic
from components.machine import describe
from experiments import claims as cl
from experiments import evidence as ev
from experiments import plots
from experiments.definitions import settings_diff
from experiments.proof import load_proofs
from experiments.proof_report import proof_section
from experiments.report_collapse import collapse_section
from experiments.report_seeds import seeds_section
from experiments.report_silence import held_out_silence, silence_by_benchmark, training_silence
from experiments.report_single import single_agent_section
from experiments.results import DevsetInfo, EvalCell, ResultsFile, SilenceCounts, load_results_dir
from experiments.rules import VerdictRules, rules_block, rules_of
from experiments.verdicts import banner, chance_section, is_v2

SYSTEM_LABELS = {"single_cot": "CoT", "self_consistency": "SC", "mas_untrained": "untrained MAS (free-for-all)",
                 "mas_prior": "prior only (no RL)"}
def paper_rows(record: cl.Record = cl.DEFAULT_RECORD) -> tuple[tuple[str, str, str], ...]:
    """Rows of the paper-shaped table, the runs of record in their roles: (experiment, system, label
    when the experiment has not run)."""
    return (("baselines", "single_cot", "CoT"),
            ("baselines", "self_consistency", "SC"),
            ("baselines", "mas_untrained", "untrained MAS (free-for-all)"),
            ("baselines", "mas_prior", "prior only (no RL)"),
            (record.b50, "agent_gspo", "Agent-GSPO B50"),
            (record.b25, "agent_gspo", "Agent-GSPO B25"),
            (record.lambda0, "agent_gspo", "λ=0"),
            (record.no_adv_norm, "agent_gspo", "no-adv-norm"),
            (record.grpo_token, "agent_gspo", "GRPO-token"))


@dataclass
class Row:
    experiment: str
    system: str
    label: str
    cells: dict[str, EvalCell] | None
    """None: the experiment has not run"""
    silence: SilenceCounts | None = None
    """held-out silence per (agent, round); None where the file did not record it"""


@dataclass
class ReportOutput:
    markdown: str
    paths: dict[str, Path] = field(default_factory=dict)
    claims: list[cl.Claim] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    """paper-table experiments without a results file"""


def rows_of(results: Mapping[str, ResultsFile], record: cl.Record = cl.DEFAULT_RECORD) -> list[Row]:
    """The paper's rows (in its order), then every other system found in the folder."""
    rows, seen = [], set()
    for exp, system, default in paper_rows(record):
        res = results.get(exp)
        label = default if res is None or res.kind == "baselines" else (res.label or default)
        rows.append(Row(exp, system, label, None if res is None else res.eval.get(system), _silence(res, system)))
        seen.add((exp, system))
    for name, res in results.items():
        for system, cells in res.eval.items():
            if (name, system) not in seen:
                label = SYSTEM_LABELS.get(system, system) if res.kind == "baselines" else res.label
                rows.append(Row(name, system, f"{label} ({name})", cells, _silence(res, system)))
    return rows


def _silence(res: ResultsFile | None, system: str) -> SilenceCounts | None:
    return None if res is None or res.silence is None else res.silence.get(system)


def benchmark_order(results: Mapping[str, ResultsFile]) -> list[str]:
    found = {b for res in results.values() for cells in res.eval.values() for b in cells}
    return [b for b in BENCHMARKS if b in found] + sorted(found - set(BENCHMARKS))


def accuracy_cell(c: EvalCell) -> str:
    """``accuracy ± se / total tokens`` (tokens exact: the table must equal the JSON)."""
    return f"{c.accuracy:.3f} ± {c.accuracy_se:.3f} / {c.tokens_total}"


def per_correct(tokens: int, correct: int) -> str:
    return f"{tokens / correct:.1f}" if correct else "-"


def _tables(rows: list[Row], benches: list[str]) -> list[str]:
    def head(last: str) -> list[str]:
        return ["| System | experiment | " + " | ".join([*benches, last]) + " |",
                "|---|---|" + "---|" * (len(benches) + 1)]

    acc, tpc = head("mean"), head("all")
    for r in rows:
        if r.cells is None:
            acc.append(f"| {r.label} | {r.experiment} | " + " | ".join(["not run"] * (len(benches) + 1)) + " |")
            tpc.append(f"| {r.label} | {r.experiment} | " + " | ".join(["not run"] * (len(benches) + 1)) + " |")
            continue
        mine = [b for b in benches if b in r.cells]
        m = ev.macro(r.cells, mine)
        correct = sum(r.cells[b].correct for b in mine)
        acc.append(f"| {r.label} | {r.experiment} | " + " | ".join(
            accuracy_cell(r.cells[b]) if b in r.cells else "-" for b in benches)
            + f" | {m.accuracy:.3f} ± {m.se:.3f} / {m.tokens_total} |")
        tpc.append(f"| {r.label} | {r.experiment} | " + " | ".join(
            per_correct(r.cells[b].tokens_total, r.cells[b].correct) if b in r.cells else "-" for b in benches)
            + f" | {per_correct(m.tokens_total, correct)} |")
    return ["## Accuracy and tokens", "",
            "Cells: accuracy ± standard error (sqrt(p(1-p)/n)) / total tokens (prompt + completion, summed over "
            "the evaluated items). `mean`: macro accuracy over benchmarks ± sqrt(Σ se²)/n_benchmarks / summed "
            "tokens.", "", *acc, "", "## Tokens per correct answer", "",
            "Total tokens / correct answers ('-': none correct).", "", *tpc, ""]


def _token_breakdown(rows: list[Row]) -> list[str]:
    """Per-item prompt / completion / communicated tokens of every system that ran: a penalty on generated
    tokens can only shrink the completion share, so this says how far total tokens can fall at all."""
    out = ["## Where the tokens go", "",
           "Means per evaluated item over all benchmarks. Prompt tokens are every turn's input (system prompt, "
           "task, delivered messages), re-read by each agent in each round; only completion tokens are "
           "generated, and only they carry the token penalty. Communicated: delivered tokens x recipients. "
           "Turns: non-silent messages per item; calls skipped: agent turns the protocol did not prompt (silence "
           "retired the agent, or nothing new); cap hit: messages that reached the message cap ('-': not "
           "recorded in that file).", "",
           "| System | experiment | prompt / item | completion / item | communicated / item | completion share "
           "of total | silence rate | turns | calls skipped | cap hit |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.cells is None:
            continue
        cells = list(r.cells.values())
        n = sum(c.n for c in cells) or 1
        prompt, completion = sum(c.tokens_prompt for c in cells), sum(c.tokens_completion for c in cells)
        total = sum(c.tokens_total for c in cells) or 1
        silence = sum(c.silence_rate * c.n for c in cells) / n
        turns, skipped = sum(c.turns * c.n for c in cells) / n, sum(c.calls_skipped * c.n for c in cells) / n
        msgs = sum(c.messages * c.n for c in cells)
        capped = (f"{sum(c.cap_hit_rate * c.messages * c.n for c in cells) / msgs:.0%}"  # type: ignore[operator]
                  if msgs and all(c.cap_hit_rate is not None for c in cells) else "-")
        out.append(f"| {r.label} | {r.experiment} | {prompt / n:.1f} | {completion / n:.1f} | "
                   f"{sum(c.tokens_communicated for c in cells) / n:.1f} | {completion / total:.1%} | {silence:.2f} | "
                   f"{turns:.2f} | {skipped:.2f} | {capped} |")
    return [*out, ""]


def _training(results: Mapping[str, ResultsFile], rules: VerdictRules) -> list[str]:
    trained = {n: r for n, r in results.items() if r.history}
    if not trained:
        return ["## Training", "", "No trained experiment has results yet.", ""]
    out = ["## Training", "",
           "Last-k means over the final k steps (k = experiments.last_k at run time, at most the number of steps); "
           "std over all steps.", "",
           "| experiment | steps | B | tokens/episode (last k) | vs B | λ_tok (final) | reward mean (std) | "
           "accuracy mean | silence (last k) | zero-advantage groups | collapse |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for name, res in trained.items():
        h, k = res.history, min(res.last_k, len(res.history))
        err = ev.budget_error(res)
        rew = ev.series(h, "train/reward")
        lam = ev.series(h, "train/lambda_tok")
        tokens = ev.last_k_mean(h, "train/budget_tokens", k)
        acc = ev.last_k_mean(h, "train/accuracy", len(h))
        sil = ev.last_k_mean(h, "train/silence_rate", k)
        out.append(f"| {name} | {len(h)} | {f'{res.budget.target:.1f}' if res.budget else '-'} | "
                   f"{ev.fmt(tokens, '.1f')} | {f'{err[1]:+.1%}' if err else '-'} | "
                   f"{ev.fmt(lam[-1] if lam else None, '.4f')} | {ev.fmt(sum(rew) / len(rew) if rew else None)} "
                   f"({ev.fmt(ev.spread(rew))}) | {ev.fmt(acc)} | {ev.fmt(sil, '.2f')} | {_zero_adv(h)} | "
                   f"{ev.collapse(res, rules) or '-'} |")
        if _never_updated(h):
            notes.append(f"- **{name}: every group had zero advantage at every step, so no update moved the policy** "
                         "(all episodes of a group got the same reward, e.g. none solved its question); its "
                         "evaluation is the base model's.")
    return [*out, "", *notes, *([""] if notes else [])]


def _zero_adv(history: list[dict[str, float]]) -> str:
    """'zero / all' advantage groups summed over steps ('-' when the run did not log them).
    A group whose episodes all got the same reward has zero advantage: it teaches nothing."""
    zero, groups = ev.series(history, "train/zero_adv_groups"), ev.series(history, "train/adv_groups")
    return f"{sum(zero):.0f} / {sum(groups):.0f}" if groups else "-"


def _never_updated(history: list[dict[str, float]]) -> bool:
    zero, groups = ev.series(history, "train/zero_adv_groups"), ev.series(history, "train/adv_groups")
    return bool(groups) and len(zero) == len(groups) == len(history) and zero == groups


def _provenance(results: Mapping[str, ResultsFile]) -> list[str]:
    if not results:
        return []
    out = ["## Experiments", "",
           "| experiment | what | overrides (on the profile) | B from | profile | model | config | items | git | "
           "wall s | MLflow runs |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        b = (f"{r.budget.fraction:g} x {r.budget.baseline_mean:.1f} ({r.budget.system} {r.budget.figure}, "
             f"{', '.join(r.budget.benchmarks)}, {r.budget.source})" if r.budget else "-")
        runs = ", ".join(f"{k}={v}" for k, v in r.mlflow.items() if v) or "-"
        over = "<br>".join(f"`{o}`" for o in r.overrides) or "-"
        out.append(f"| {name} | {r.description or r.label} | {over} | {b} | {r.profile} | {r.model} | "
                   f"`{r.config_hash[:12]}` | `{r.item_ids_sha256[:12]}` | `{(r.git_commit or 'unknown')[:10]}` | "
                   f"{r.wall_seconds:.0f} | {runs} |")
    samples = _by_value(results, "item_ids_sha256")
    manifests = _by_value(results, "data_manifest_sha256")
    out.append("")
    for name, r in results.items():
        for c in r.carried or []:
            out.append(f"{name}: {', '.join(c.systems)} kept (`--resume`) from an earlier evaluation under the same "
                       f"config but for `eval.baselines` (git `{(c.git_commit or 'unknown')[:10]}`, config "
                       f"`{c.config_hash[:12]}`, eval run {c.eval_run_id or '-'}, {c.eval_seconds:.0f} s); the row "
                       "above is the run that evaluated the others.")
    if any(r.carried for r in results.values()):
        out.append("")
    splits = _by_value(results, "eval_split")
    if len(splits) > 1:
        out.append("**WARNING: the experiments were evaluated on different splits ("
                   + "; ".join(f"{split}: {', '.join(names)}" for split, names in splits.items())
                   + "): dev-set numbers choose recipes, test numbers are the results; do not compare them.**")
    if len(samples) > 1:
        out.append(f"**WARNING: the experiments were not all evaluated on the same items ({len(samples)} item "
                   f"samples: {_groups(samples)}); comparisons mix samples.**")
    elif len(manifests) > 1:
        # same ids, other manifest: a re-prepared data folder. The manifest pins every prepared file
        # (output_sha256) and where it came from, so only comparing the manifests says whether the
        # items' contents differ; the report has their sha256 only and cannot tell.
        out.append(f"**WARNING: the experiments were evaluated on the same item ids (sha256 "
                   f"`{next(iter(samples))[:12]}`) of {len(manifests)} prepared data versions (data/manifest.json "
                   f"sha256: {_groups(manifests)}): compare those manifests' `output_sha256` before trusting "
                   "a comparison across them.**")
    elif (one := next(iter(results.values()))).devset is not None:
        out.append(devset_line(one.devset, next(iter(samples))))
    else:
        out.append(f"All experiments were evaluated on the same seeded sample ({one.limit or 'all'} items per "
                   f"benchmark, item ids sha256 `{next(iter(samples))[:12]}`).")
    groups: dict[str, list[str]] = {}
    for name, r in results.items():
        groups.setdefault(repr(sorted(r.settings.items())), []).append(name)
    if len(groups) > 1:
        first = next(iter(results.values())).settings
        keys = sorted({d.split(":", 1)[0] for r in results.values() for d in settings_diff(first, r.settings)})
        out += ["", f"**WARNING: the experiments ran under {len(groups)} different settings (they differ in "
                f"{', '.join(keys)}): " + "; ".join(", ".join(g) for g in groups.values())
                + ". Rows from different groups are not comparable, and a claim that compares them is INCONCLUSIVE.**"]
    out += ["", _machines_line(results)]
    return [*out, ""]


def _machines_line(results: Mapping[str, ResultsFile]) -> str:
    """Which machine measured which experiments (components/machine.py says why it matters)."""
    machines: dict[str, list[str]] = {}
    for name, r in results.items():
        machines.setdefault(describe(r.machine), []).append(name)
    line = "Measured on: " + "; ".join(f"{m} ({', '.join(names)})" for m, names in machines.items()) + "."
    if len([m for m in machines if m != describe(None)]) > 1:
        line += (" Greedy bf16 decodes and wall times differ between machines (other kernels, other "
                 "rounding): compare rows measured on one machine.")
    return line


def devset_line(dev: DevsetInfo, ids_sha256: str) -> str:
    """The sentence that says a results set was evaluated on the dev set, not on the test items."""
    per = ", ".join(f"{b} {d.n} from {d.source}" for b, d in dev.benchmarks.items())
    trained = [b for b, d in dev.benchmarks.items() if d.in_train_sources]
    seen = (f" The dev items of {', '.join(trained)} come from a split in data.train_sources: a recipe trained "
            "on it has seen them." if trained else "")
    return (f"All experiments were evaluated on the DEV SET, not the test sample (split `devset`, dev ids sha256 "
            f"`{ids_sha256[:12]}`; {per}; disjoint from the test sample of eval.limit {dev.test_limit or 'all'}). "
            f"These numbers are for choosing recipes, caps and budgets, not results.{seen}")


def _by_value(results: Mapping[str, ResultsFile], field: str) -> dict[str, list[str]]:
    """Experiment names grouped by the value of ``field`` (first appearance order)."""
    groups: dict[str, list[str]] = {}
    for name, r in results.items():
        groups.setdefault(str(getattr(r, field)), []).append(name)
    return groups


def _groups(groups: dict[str, list[str]]) -> str:
    return "; ".join(f"`{value[:12]}` ({', '.join(names)})" for value, names in groups.items())


def _claims_md(claims: list[cl.Claim], record: cl.Record) -> list[str]:
    out = ["## Claims", "", "Computed from the numbers above (see experiments/claims.py for each rule).", "",
           *rules_block(record.rules)]
    if record.roles() != cl.DEFAULT_RECORD.roles():
        roles = ", ".join(f"{role} = `{name}`" for role, name in record.roles().items())
        out += [f"Runs of record (`experiments.record`, not the paper's default names): {roles}.", ""]
    for c in claims:
        out.append(f"### ({c.key}) {c.title}: **{c.status}**")
        out.append("")
        out += [f"- {line}" for line in c.evidence]
        out.append("")
    return out


def build_report(results_dir: str | Path, out: str | Path, *, command: str | None = None,
                 record: cl.Record = cl.DEFAULT_RECORD) -> ReportOutput:
    """Read every ``<results_dir>/*.json`` and write ``out`` (markdown) + PNGs in ``<out dir>/<out stem>/``.

    ``record`` names the runs of record the claims judge and the paper-shaped rows show. A results
    file that does not parse or fit the schema raises :class:`ResultsFileError` naming it.
    """
    results_dir, out = Path(results_dir), Path(out)
    rules = rules_of(record.rules)  # a results set that names no judge is refused before anything is written
    found = load_results_dir(results_dir)
    order = list(dict.fromkeys(e for e, _, _ in paper_rows(record)))
    results = dict(sorted(found.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0])))
    command = command or f"agent-gspo experiments report --results {results_dir} --out {out}"
    fig_dir = out.parent / out.stem
    benches = benchmark_order(results)
    rows = rows_of(results, record)
    claims = cl.all_claims(results, record)
    missing = [e for e in dict.fromkeys(r.experiment for r in rows) if e not in results]

    points = []
    for r in rows:
        if r.cells is None:
            continue
        for b, c in r.cells.items():
            points.append(plots.Point(r.label, b, c.tokens_total_mean, c.accuracy, c.accuracy_se))
        m = ev.macro(r.cells, list(r.cells))
        n_items = m.n or 1
        points.append(plots.Point(r.label, "mean", m.tokens_total / n_items, m.accuracy, m.se))
    histories = {n: r.history for n, r in results.items() if r.history}
    budgets = {n: r.budget.target for n, r in results.items() if r.budget and r.history}
    paths = {
        "accuracy_vs_tokens": plots.plot_accuracy_vs_tokens(points, fig_dir / "accuracy_vs_tokens.png"),
        "lambda_tok": plots.plot_curves(histories, "train/lambda_tok", fig_dir / "lambda_tok.png", ylabel="λ_tok",
                                        title="Dual variable λ_tok over training"),
        "tokens_vs_budget": plots.plot_curves(histories, "train/budget_tokens", fig_dir / "tokens_vs_budget.png",
                                              ylabel="tokens / episode (budget measure)", budgets=budgets,
                                              title="Tokens per episode against the budget B"),
        "reward": plots.plot_curves(histories, "train/reward", fig_dir / "reward.png", ylabel="reward",
                                    title="Reward over training"),
        "silence": plots.plot_silence(histories, fig_dir / "silence.png"),
    }
    rel = fig_dir.name
    md = [f"<!-- generated by `{command}`: do not edit by hand -->", "# Results: Agent-GSPO token economy at small "
          "scale", "",
          f"*Generated by `{command}` from `{results_dir}/*.json` (one file per experiment, written by "
          "`agent-gspo experiments run`). Do not edit by hand.*", ""]
    if results:
        limits = ", ".join(sorted({str(r.limit or "all") for r in results.values()}))
        steps = ", ".join(str(n) for n in sorted({len(r.history) for r in results.values() if r.history}))
        trained = f"{steps} GSPO step(s) per trained experiment" if steps else "no trained experiment yet"
        md += [f"Scale of these runs: {limits} item(s) per benchmark; {trained} "
               "(overrides per experiment are listed under Experiments).", ""]
    if missing:
        md += [f"Not run yet: {', '.join(missing)}.", ""]
    md += banner(record)
    md += _tables(rows, benches)
    md += [f"![accuracy vs tokens]({rel}/accuracy_vs_tokens.png)", ""]
    if is_v2(rules):  # issue 52's tables; a v1 report stays as it was
        md += chance_section(rows, benches, rules) + single_agent_section(rows, results)
    md += _token_breakdown(rows)
    md += held_out_silence(rows) + silence_by_benchmark(rows, benches)
    if is_v2(rules):
        md += collapse_section(rows, rules)
    md += _claims_md(claims, record)
    md += seeds_section(results)
    md += _training(results, rules)
    md += [f"![λ_tok]({rel}/lambda_tok.png)", "", f"![tokens vs budget]({rel}/tokens_vs_budget.png)", "",
           f"![reward]({rel}/reward.png)", "", f"![silence per agent and round]({rel}/silence.png)", ""]
    md += training_silence(results)
    for proof in load_proofs(results_dir).values():
        lines, proof_claims, proof_paths = proof_section(proof, fig_dir, rel, rules)
        md += lines
        claims += proof_claims
        paths.update(proof_paths)
    md += _provenance(results)
    markdown = "\n".join(md).rstrip("\n") + "\n"
    write_text_atomic(out, markdown)
    paths["report"] = out
    return ReportOutput(markdown, paths, claims, missing)

