"""The report's "Seeds" section: replicates are found by recipe, never by name, and their spread is computed."""

from __future__ import annotations

from helpers.experiments_fixtures import SETTINGS, baselines, cell, make_results, trained  # noqa: E402

from experiments.report import build_report  # noqa: E402
from experiments.report_seeds import recipe_key, replicate_groups, seeds_section  # noqa: E402
from experiments.results import write_results  # noqa: E402

RECIPE = ["data.train_sources=['mmlu/val']", "mas.must_answer=true", "budget.fraction=0.25"]


def _run(name: str, seed: int, tokens: tuple[int, int], acc: float = 0.3, overrides: list[str] | None = None, **kw):
    seed_override = [f"gspo.seed={seed}"] if seed else []
    return make_results(name, {"agent_gspo": {"gsm8k": cell(acc, tokens[0]), "svamp": cell(acc, tokens[1])}},
                        budget_target=25.0, seed=seed,
                        overrides=[*(overrides if overrides is not None else RECIPE[:-1]), *seed_override,
                                   RECIPE[-1]], **kw)


def _results(*runs):
    return {"baselines": baselines(mas_tokens=100_000), **{r.name: r for r in runs}}


def test_runs_that_differ_only_in_seed_are_replicates_whatever_their_names():
    a, b = _run("recipe", 0, (40_000, 60_000)), _run("other_name", 3, (50_000, 30_000))
    assert recipe_key(a) == recipe_key(b)
    assert replicate_groups(_results(b, a)) == [["recipe", "other_name"]]  # seeds ascending


def test_another_override_or_setting_or_one_seed_is_not_a_replicate():
    a = _run("a", 0, (40_000, 40_000))
    other_recipe = _run("b", 1, (40_000, 40_000), overrides=["data.train_sources=['gsm8k/train']"])
    other_cap = _run("c", 2, (40_000, 40_000), settings=SETTINGS | {"mas.max_message_tokens": 64})
    other_items = _run("e", 4, (40_000, 40_000), item_ids="b" * 64)
    same_seed = _run("d", 0, (40_000, 40_000))  # a re-run on the same seed is no second seed
    assert replicate_groups(_results(a, other_recipe, other_cap, other_items)) == []
    assert replicate_groups(_results(a, same_seed)) == []
    assert seeds_section(_results(a, other_recipe)) == []


def test_spread_is_computed_from_the_files_and_names_the_widest_benchmark():
    # untrained MAS: 100k tokens on each benchmark; seed 0 at 0.40x / 0.60x, seed 1 at 0.50x / 0.30x
    lines = seeds_section(_results(_run("r", 0, (40_000, 60_000), acc=0.30), _run("r_s1", 1, (50_000, 30_000),
                                                                                        acc=0.40)))
    text = "\n".join(lines)
    assert "| r | 0 | 0.50x | +0.000 ± " in text and "| r_s1 | 1 | 0.40x | +0.100 ± " in text
    assert "spread across 2 seeds 0.10x in total tokens (0.40x – 0.50x), 0.100 in accuracy difference" in text
    assert "widest on svamp: 0.30x – 0.60x" in text


def test_no_untrained_mas_no_section_and_the_report_carries_it(tmp_path):
    runs = [_run("r", 0, (40_000, 60_000)), _run("r_s1", 1, (50_000, 30_000))]
    assert seeds_section({r.name: r for r in runs}) == []
    for r in [baselines(), trained("gspo_b25", 0.3, 20_000), *runs]:
        write_results(tmp_path / f"{r.name}.json", r)
    report = build_report(tmp_path, tmp_path / "results.md")
    assert "## Seeds: one recipe, more than one training seed" in report.markdown
    assert "| r_s1 | 1 | 0.40x |" in report.markdown
