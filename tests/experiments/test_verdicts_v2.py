"""Issue 52 in the seven-benchmark report (verdict rules v2): non-inferiority instead of "within one SE",
the above-chance table, collapse named, every team against one agent at equal tokens; and under v1
the committed reports as they were, byte for byte."""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.experiments_fixtures import baselines, cell, columns, history, make_results
from helpers.paths import REPO_ROOT

from experiments.claims import claim_a, claim_f
from experiments.report import build_report
from experiments.report_collapse import NOT_RECORDED, collapse_lines, content_lines, hidden_collapses
from experiments.report_single import Cost, beats_sentence, equal_tokens
from experiments.results import EvalCell, SilenceCounts, write_results
from experiments.rules import V2
from experiments.schema import RecordConfig as Record
from experiments.verdicts import chance_caveat, chance_section

V1, V2_RECORD = Record(rules="v1"), Record(rules="v2")


def _paired_set(down: int, up: int, n: int) -> dict:
    """Baselines and gspo_b25 with per-item outcomes on gsm8k and svamp: the trained run loses ``down``
    items the untrained MAS solved and wins ``up`` it did not, per benchmark; a third of its tokens."""
    base = [i % 2 == 0 for i in range(n)]
    mine = list(base)
    for i in range(down):
        mine[2 * i] = False  # solved by the untrained MAS, not by the trained run
    for i in range(up):
        mine[2 * i + 1] = True
    untrained = {b: columns(base, [30] * n) for b in ("gsm8k", "svamp")}
    single = {"single_cot": {"gsm8k": cell(0.20, 2_000), "svamp": cell(0.25, 1_800)}}
    base_file = make_results("baselines", single | {"mas_untrained": {}}, kind="baselines",
                             items={"mas_untrained": untrained})
    trained = make_results("gspo_b25", {"agent_gspo": {}}, hist=history([100, 100, 100]), budget_target=100.0,
                           items={"agent_gspo": {bb: columns(mine, [10] * n) for bb in ("gsm8k", "svamp")}})
    return {"baselines": base_file, "gspo_b25": trained}


def test_within_one_se_passed_what_non_inferiority_fails():
    """6 lost and 4 won of 40 per benchmark: -0.05, within one paired SE (v1 PASS), but the lower 95 %
    bound is far below -0.05 (v2 FAIL), and the line says how many items 80 % power needs."""
    results = _paired_set(down=6, up=4, n=40)
    assert claim_f(results, V1).status == "PASS"
    f = claim_f(results, V2_RECORD)
    assert f.status == "FAIL", f
    line = next(e for e in f.evidence if e.startswith("non-inferiority"))
    assert "FAIL: lower 95% bound" in line and "vs -margin -0.0500" in line and "per benchmark give 80% power" in line
    assert "non-inferior (margin 0.05, one-sided 95%)" in f.title


def test_non_inferiority_passes_on_enough_items_with_a_small_difference():
    results = _paired_set(down=2, up=2, n=400)
    f = claim_f(results, V2_RECORD)
    assert f.status == "PASS", f
    assert any(e.startswith("non-inferiority of gspo_b25 to the untrained MAS: PASS") for e in f.evidence)


def test_without_per_item_outcomes_non_inferiority_cannot_pass():
    results = {"baselines": baselines(),
               "gspo_b25": make_results("gspo_b25", {"agent_gspo": {"gsm8k": cell(0.3, 20_000),
                                                                    "svamp": cell(0.3, 20_000)}},
                                        hist=history([100, 100, 100]), budget_target=100.0)}
    assert claim_f(results, V1).status == "PASS"
    f = claim_f(results, V2_RECORD)
    assert f.status == "INCONCLUSIVE" and any("no per-item outcomes" in e for e in f.evidence), f


@dataclass
class _Row:
    experiment: str
    system: str
    label: str
    cells: dict[str, EvalCell] | None
    silence: SilenceCounts | None = None


def _cells(**acc: float) -> dict[str, EvalCell]:
    return {b: EvalCell.model_validate(cell(a, 1_000)) for b, a in acc.items()}


def test_chance_table_per_multiple_choice_benchmark_and_the_caveat_of_a_verdict_leaning_on_it():
    rows = [_Row("baselines", "single_cot", "CoT", _cells(mmlu=0.40, aqua=0.20, gsm8k=0.3)),
            _Row("gspo_b25", "agent_gspo", "B25", _cells(mmlu=0.25, gsm8k=0.3)),
            _Row("lambda0", "agent_gspo", "λ=0", None)]
    md = "\n".join(chance_section(rows, ["mmlu", "gsm8k", "aqua"], V2))
    assert "| System | experiment | mmlu | aqua |" in md and "gsm8k |" not in md
    assert "| CoT | baselines | 40 / 100, p 0.00: **yes** | 20 / 100, p 0.54: no |" in md
    assert "| B25 | gspo_b25 | 25 / 100, p 0.54: no | - |" in md and "λ=0" not in md
    guess = make_results("gspo_b25", {"agent_gspo": {"mmlu": cell(0.26, 100), "aqua": cell(0.21, 100),
                                                     "gsm8k": cell(0.3, 100)}})
    smart = make_results("baselines", {"mas_untrained": {"mmlu": cell(0.45, 100), "aqua": cell(0.19, 100),
                                                         "gsm8k": cell(0.3, 100)}}, kind="baselines")
    results = {"gspo_b25": guess, "baselines": smart}
    line = chance_caveat(results, [("gspo_b25", "agent_gspo"), ("baselines", "mas_untrained")], V2)
    assert len(line) == 1 and "on aqua neither gspo_b25 nor baselines/mas_untrained is above chance" in line[0]
    assert "(1 of 3 benchmarks)" in line[0]
    assert chance_caveat(results, [("gspo_b25", "agent_gspo")], V2)[0].startswith("chance: on mmlu, aqua")


def _silence(round0: list[int], sent: int = 100, **extra) -> SilenceCounts:
    return SilenceCounts.model_validate({"silent": [[s, 0] for s in round0], "sent": [[sent, 10]] * len(round0)}
                                        | extra)


def test_collapse_is_named_on_the_aggregate_and_per_benchmark():
    agg = collapse_lines(_silence([0, 95, 92]), V2)
    assert agg == ["over all benchmarks (this file records no per-benchmark silence): agent 1 (95%), agent 2 (92%) "
                   "silent before any answer: a collapse to 1 speaking agent, not strategic silence"]
    assert "no collapse" in collapse_lines(_silence([0, 89, 80]), V2)[0]
    # pooled over 7 benchmarks of 100 items, 564 of 700 silent turns fit a collapse on up to 6 of them
    pooled = collapse_lines(_silence([0, 564, 60], sent=700), V2, benchmarks=7)
    assert "agent 1 silent on 564/700 round-0 turns, so on up to 6 of 7 benchmarks" in pooled[0]
    assert "agent 2 silent on 60/700 round-0 turns" not in pooled[0] and "collapse undetermined" in pooled[0]
    assert hidden_collapses(_silence([0, 90, 89], sent=700), 0.9, 7) == {1: 1}
    assert "no collapse" in collapse_lines(_silence([0, 89, 80], sent=700), V2, benchmarks=7)[0]
    per = _silence([0, 60, 50], by_benchmark={"gsm8k": {"silent": [[0, 0], [50, 0], [10, 0]],
                                                        "sent": [[50, 5], [50, 5], [50, 5]]},
                                              "svamp": {"silent": [[0, 0], [10, 0], [40, 0]],
                                                        "sent": [[50, 5], [50, 5], [50, 5]]}})
    assert collapse_lines(per, V2) == [
        "on gsm8k: agent 1 (100%) silent before any answer: a collapse to 2 speaking agents, not strategic silence"]
    assert content_lines(per) == [NOT_RECORDED]
    content = {"turn_order": "simultaneous", "round0_no_answer": [[0, 100], [95, 100]],
               "round0_after_answer": [[0, 0], [0, 0]], "round1_agreed": [[1, 40], [0, 0]],
               "round1_disagreed": [[0, 20], [0, 0]]}
    lines = content_lines(_silence([0, 95], content=content))
    assert lines[1] == ("agent 1: round 0 before any answer 95% of 100, after an answer n/a; round 1 after agreeing "
                        "answers n/a, after differing answers n/a (simultaneous)")
    assert "after agreeing answers 2% of 40" in lines[0]
    with pytest.raises(ValueError, match=r"round1_agreed\[0\]"):
        _silence([0, 95], content=content | {"round1_agreed": [[41, 40], [0, 0]]})


def test_the_report_names_a_collapsed_trained_team_in_the_claims(tmp_path):
    results = _paired_set(down=2, up=2, n=400)
    results["gspo_b25"] = results["gspo_b25"].model_copy(update={"silence": {"agent_gspo": _silence([0, 99, 98])}})
    folder = tmp_path / "results"
    folder.mkdir()
    for r in results.values():
        write_results(folder / f"{r.name}.json", r)
    rep = build_report(folder, tmp_path / "r.md", record=V2_RECORD)
    a = next(c for c in rep.claims if c.key == "a")
    assert any("collapse to 1 speaking agent" in e for e in a.evidence), a
    assert "## Collapse or strategic silence?" in rep.markdown and "## Above chance?" not in rep.markdown
    assert "## Every team against one agent at equal tokens" in rep.markdown
    v1 = build_report(folder, tmp_path / "s.md", record=V1).markdown
    assert "Collapse or strategic" not in v1 and "equal tokens" not in v1 and claim_a(results, V1).status


def test_equal_tokens_is_the_closest_single_agent_not_below_the_team():
    team = Cost("B25", 0.10, 1_000.0)
    cot, sc = Cost("CoT", 0.08, 200.0), Cost("SC", 0.09, 1_100.0)
    assert equal_tokens(team, [cot, sc]) == sc
    assert equal_tokens(team, [cot, Cost("SC", 0.09, 900.0)]).label == "SC"  # none at or above: closest below
    assert equal_tokens(Cost("B25", 0.1, 100.0), [cot, sc]) == cot
    assert team.per_1k == pytest.approx(0.1) and cot.per_1k == pytest.approx(0.4)
    assert beats_sentence([("gspo_b25", team, [cot, sc])]).startswith(
        "**No trained team beats every single agent on accuracy per 1,000 tokens**: the best of 1, gspo_b25, has "
        "0.100 against CoT 0.400, SC 0.082")
    assert beats_sentence([("gspo_b25", Cost("B25", 0.5, 100.0), [cot, sc])]).startswith("**1 of 1 trained")


V1_REPORTS = {  # sha256 of each committed report as v1 judged it (before the switch to v2)
    "docs/results.md": ("results", None, "11403e963e92b6477a699a32a5abbab316c4a019fcd376de37ba71f0564fe8db"),
    "docs/results-cap128.md": ("results/cap128", "mix_answer",
                               "23def92b5514e48db40cb3d3d61628ad49b2f1550bee0ffd25682756c2ea220d"),
    "docs/results-reduced.md": ("results/reduced", None,
                                "1292bccd37e34eb983e3069a9f96b8a7b5eaab7fdc89b6827f0a6128c5777419"),
}


@pytest.mark.parametrize("report", list(V1_REPORTS))
def test_under_v1_the_reports_are_what_they_were_byte_for_byte(tmp_path, monkeypatch, report):
    folder, suffix, digest = V1_REPORTS[report]
    roles = {} if suffix is None else {r: f"{d}_{suffix}" for r, d in
                                       (("b25", "gspo_b25"), ("b50", "gspo_b50"), ("lambda0", "lambda0"),
                                        ("no_adv_norm", "no_adv_norm"), ("grpo_token", "grpo_token"))}
    shutil.copytree(REPO_ROOT / "results", tmp_path / "results")
    monkeypatch.chdir(tmp_path)
    md = build_report(Path(folder), Path(report), record=Record(rules="v1", **roles)).markdown
    assert hashlib.sha256(md.encode()).hexdigest() == digest
