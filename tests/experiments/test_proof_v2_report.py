"""The splitinfo2 proof report: targets per seed and per family under rules v2, the budget band over
the last window of episodes in a share of seeds, the two cost terms per step, and clear refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.errors import UserError
from experiments.cli import main
from experiments.proof_v2_report import ProofV2Error, TrainingRun, band_reach, build_proof_v2_report, cost_split
from experiments.rules import V2, rules_of

GOOD = {"items": 40, "answerable": 40, "accuracy": 0.95, "silence_uninformed": 0.95, "silence_informed": 0.0,
        "distractor_said": 0.05, "final_distractor": 0.0, "tokens_total": 30.0}
UNTRAINED = {**GOOD, "accuracy": 0.4, "silence_uninformed": 0.0, "tokens_total": 100.0}


def _families(folder: Path, systems: dict, name: str = "families.json", ids: str = "a" * 64) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    record = {"item_ids_sha256": ids, "limit": 80, "systems": {
        s: {"all": {"all": n}, "family": {"quote": n, "table": n}} for s, n in systems.items()}}
    (folder / name).write_text(json.dumps(record))


def _run(folder: Path, name: str, tokens: list[float], target: float = 20.0) -> None:
    run = folder / "runs" / name
    run.mkdir(parents=True)
    history = [{"step": float(i + 1), "train/budget_tokens": t, "train/lambda_tok": 0.2, "train/turns": 2.0}
               for i, t in enumerate(tokens)]
    (run / "history.json").write_text(json.dumps(history))
    (run / "metrics.json").write_text(json.dumps({"budget_calibration": {"target": target}}))


def _build(folder: Path, tmp_path: Path, version: str = "v2") -> dict[str, bool]:
    return build_proof_v2_report(folder, tmp_path / "report.md", version, (32.0, 0.05), 16)


def test_targets_pass_per_seed_only_when_every_family_meets_every_target(tmp_path: Path) -> None:
    folder = tmp_path / "res"
    _families(folder, {"mas_untrained": UNTRAINED, "agent_gspo_s0": GOOD,
                       "agent_gspo_s1": {**GOOD, "distractor_said": 0.11}})
    _run(folder, "agent_gspo_s0", [40.0] * 10 + [21.0] * 4)
    _run(folder, "agent_gspo_s1", [40.0] * 10 + [19.0] * 4)
    verdicts = _build(folder, tmp_path)
    assert verdicts == {"targets agent_gspo_s0": True, "targets agent_gspo_s1": False, "budget": True}
    text = (tmp_path / "report.md").read_text()
    assert "| agent_gspo_s1 | quote | 40 | 0.95 ✓ | 0.95 ✓ | 0.00 ✓ | 0.11 ✗ | 0.30 ✓ |" in text
    assert "version `v2` (`--rules`;" in text and (tmp_path / "report" / "costs.png").is_file()


def test_tokens_above_the_share_of_the_untrained_team_fail(tmp_path: Path) -> None:
    folder = tmp_path / "res"
    _families(folder, {"mas_untrained": UNTRAINED, "agent_gspo_s0": {**GOOD, "tokens_total": 36.0}})
    assert _build(folder, tmp_path)["targets agent_gspo_s0"] is False  # 0.36x > 0.35x


def test_budget_needs_the_band_in_the_share_of_seeds(tmp_path: Path) -> None:
    folder = tmp_path / "res"
    _families(folder, {"mas_untrained": UNTRAINED, "agent_gspo_s0": GOOD, "agent_gspo_s1": GOOD})
    _run(folder, "agent_gspo_s0", [20.0] * 4)       # mean 20 = B
    _run(folder, "agent_gspo_s1", [20.0, 20.0, 20.0, 30.0])  # mean 22.5: 12.5 % over B
    assert _build(folder, tmp_path)["budget"] is False     # 1 of 2 < 75 %
    text = (tmp_path / "report.md").read_text()
    assert "agent_gspo_s1: mean 22.5 vs B 20.0 over 64 episodes: outside" in text
    assert "λ_tok over the window +0.20, +0.20, +0.20, +0.20, token cost 0.141 vs turn cost 0.100" in text


def test_a_budgeted_variant_is_shown_but_outside_the_budget_verdict(tmp_path: Path) -> None:
    folder = tmp_path / "res"
    _families(folder, {"mas_untrained": UNTRAINED, "agent_gspo_s0": GOOD, "in_turn_trained_s0": GOOD})
    _run(folder, "agent_gspo_s0", [20.0] * 4)
    _run(folder, "in_turn_trained_s0", [60.0] * 4)  # 3x B: would fail the share of seeds if it counted
    lambda0 = folder / "runs" / "lambda0_s0"  # no budget at all: no line, no cost split
    lambda0.mkdir(parents=True)
    (lambda0 / "history.json").write_text(json.dumps([{"step": 1.0, "train/budget_tokens": 90.0}]))
    (lambda0 / "metrics.json").write_text(json.dumps({}))
    verdicts = _build(folder, tmp_path)
    assert verdicts == {"targets agent_gspo_s0": True, "budget": True}
    text = (tmp_path / "report.md").read_text()
    assert "- in_turn_trained_s0 (not a registered seed: outside the verdict): mean 60.0 vs B 20.0" in text
    assert "lambda0_s0: mean" not in text and "- lambda0_s0:" not in text


def test_too_short_a_history_does_not_hold_the_budget(tmp_path: Path) -> None:
    folder = tmp_path / "res"
    _families(folder, {"agent_gspo_s0": GOOD})
    _run(folder, "agent_gspo_s0", [20.0] * 3)  # 48 episodes < the 64-episode window
    assert _build(folder, tmp_path)["budget"] is False


def _reach(tokens: list[float], target: float = 20.0):
    history = [{"step": float(i + 1), "train/budget_tokens": t} for i, t in enumerate(tokens)]
    return band_reach(TrainingRun(history, {"target": target}), rules_of("v2"), 16)


def test_band_reach_measures_the_second_half_against_the_band() -> None:
    # second half 20, 20, 20, 20, 30, 10, 20, 20: five 4-step windows, means 20, 22.5, 20, 20, 20
    reach = _reach([99.0] * 8 + [20.0, 20.0, 20.0, 20.0, 30.0, 10.0, 20.0, 20.0])
    assert reach is not None and (reach.windows_inside, reach.windows) == (4, 5)
    assert reach.spread == pytest.approx(0.267, abs=1e-3)          # stdev 5.35 tokens / B 20
    assert reach.window_spread == pytest.approx(reach.spread / 2)  # 4 steps per 64-episode window
    # P(|N(0, 0.134)| <= 0.1) = 0.54; a chance of 0.75 needs (0.134 * 1.15 / 0.1)^2 x 64 = 152 episodes
    assert reach.chance == pytest.approx(0.544, abs=0.005)
    assert reach.episodes_needed == pytest.approx(152, abs=2)


def test_band_reach_of_a_steady_run_is_certain_and_of_a_short_one_unknown() -> None:
    steady = _reach([20.0] * 10)
    assert steady is not None and (steady.chance, steady.windows_inside, steady.episodes_needed) == (1.0, 2, 0)
    assert _reach([20.0] * 5) is None  # a second half of 3 steps is shorter than one window
    assert band_reach(TrainingRun([{"train/budget_tokens": 5.0}] * 10, None), rules_of("v2"), 16) is None


def test_the_report_says_how_reachable_the_band_was(tmp_path: Path) -> None:
    folder = tmp_path / "res"
    _families(folder, {"mas_untrained": UNTRAINED, "agent_gspo_s0": GOOD})
    _run(folder, "agent_gspo_s0", [40.0] * 8 + [20.0] * 8)
    _build(folder, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert ("- agent_gspo_s0: 5 of 5 windows inside the band; step spread 0.00 x B, window 0.00 x B: a centred "
            "window lands inside with chance 1.00; a chance of 0.75 needs about 0 episodes per window") in text


def test_every_team_is_set_beside_one_agent_at_equal_tokens(tmp_path: Path) -> None:
    folder = tmp_path / "res"
    _families(folder, {"mas_untrained": UNTRAINED, "agent_gspo_s0": GOOD, "in_turn_s0": {**GOOD, "tokens_total": 10.0}})
    _families(folder, {"single_cot": {**GOOD, "accuracy": 0.5, "tokens_total": 20.0},
                       "self_consistency": {**GOOD, "accuracy": 0.6, "tokens_total": 50.0}},
              name="families_single.json")
    _build(folder, tmp_path)
    text = (tmp_path / "report.md").read_text()
    # agent_gspo_s0: 0.95 at 30 tokens; SC (50 tokens) is the closest single agent not below it
    assert ("| agent_gspo_s0 | 0.950 / 30 / 31.667 | 0.500 / 20 / 25.000 | 0.600 / 50 / 12.000 | SC (1.67x) "
            "| +0.350 |") in text
    assert "| in_turn_s0 | 0.950 / 10 / 95.000 |" in text and "| CoT (2.00x) | +0.450 |" in text
    assert "**A trained team beats one agent on accuracy per 1,000 tokens**: the best, in_turn_s0, has 95.000" in text
    assert "| single_cot | 0.50 " not in text.split("## Does silence")[1]  # a lone solver hears nobody


def test_no_single_agent_system_no_section_and_untrained_teams_never_win(tmp_path: Path) -> None:
    folder = tmp_path / "res"
    _families(folder, {"mas_untrained": UNTRAINED, "agent_gspo_s0": GOOD})
    _build(folder, tmp_path)
    assert "one agent at equal tokens" not in (tmp_path / "report.md").read_text()
    _families(folder, {"single_cot": {**GOOD, "accuracy": 0.2, "tokens_total": 200.0}},
              name="families_single.json")
    _families(folder, {"mas_untrained": {**UNTRAINED, "tokens_total": 1.0}, "agent_gspo_s0": {**GOOD, "accuracy": 0.0}})
    _build(folder, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert ("**No trained team beats one agent on accuracy per 1,000 tokens**: the best, agent_gspo_s0, "
            "has 0.000") in text


def test_cost_split_is_the_rewards_two_terms() -> None:
    rows = cost_split([{"step": 1.0, "train/lambda_tok": 0.4, "train/budget_tokens": 16.0, "train/turns": 3.0}],
                      32.0, 0.05)
    assert rows == [{"step": 1.0, "lambda_tok": 0.4, "tokens": 16.0, "token_cost": pytest.approx(0.2),
                     "turn_cost": pytest.approx(0.15)}]


def test_refuses_mixed_items_repeats_and_rules_without_the_targets(tmp_path: Path) -> None:
    folder = tmp_path / "res"
    _families(folder, {"agent_gspo_s0": GOOD})
    with pytest.raises(UserError, match="judged by v2 or later"):
        _build(folder, tmp_path, "v1")
    _families(folder, {"agent_gspo_s1": GOOD}, name="families_b.json", ids="b" * 64)
    with pytest.raises(ProofV2Error, match="played different items"):
        _build(folder, tmp_path)
    _families(folder, {"agent_gspo_s0": GOOD}, name="families_b.json")
    with pytest.raises(ProofV2Error, match="'agent_gspo_s0' is also in another families file"):
        _build(folder, tmp_path)
    with pytest.raises(ProofV2Error, match="no families"):
        _build(tmp_path / "empty", tmp_path)


def test_malformed_inputs_name_the_file_and_key(tmp_path: Path) -> None:
    folder = tmp_path / "res"
    _families(folder, {"agent_gspo_s0": GOOD})
    bad = folder / "families_bad.json"
    for text, match in (("{not json", "families_bad.json"), ("[1, 2]", "a JSON object expected"),
                        ('{"item_ids_sha256": "' + "a" * 64 + '", "limit": 80}', "systems: missing or not a dict"),
                        ('{"item_ids_sha256": "' + "a" * 64 + '", "limit": 80, "systems": {"x": {}}}',
                         "systems.x: no all.all numbers")):
        bad.write_text(text)
        with pytest.raises(UserError, match=match):
            _build(folder, tmp_path)
    bad.unlink()
    _run(folder, "agent_gspo_s0", [20.0] * 4)
    (folder / "runs" / "agent_gspo_s0" / "history.json").write_text('{"step": 1}')
    with pytest.raises(ProofV2Error, match="history.json: not a training history"):
        _build(folder, tmp_path)
    (folder / "runs" / "agent_gspo_s0" / "history.json").write_text("[]")
    (folder / "runs" / "agent_gspo_s0" / "metrics.json").write_text('{"budget_calibration": "B"}')
    with pytest.raises(ProofV2Error, match="budget_calibration.target: missing or not a number"):
        _build(folder, tmp_path)
    (folder / "runs" / "agent_gspo_s0" / "history.json").unlink()
    with pytest.raises(UserError, match="history.json: results file not found"):
        _build(folder, tmp_path)


def test_cli_prints_verdicts_and_exits_2_on_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "res"
    _families(folder, {"mas_untrained": UNTRAINED, "agent_gspo_s0": GOOD})
    out = tmp_path / "r.md"
    assert main(["proof-report", "--profile", "proof_v2", "--results", str(folder), "--out", str(out),
                 "--rules", "v2"]) == 0
    assert "targets agent_gspo_s0: PASS" in capsys.readouterr().out and out.is_file()
    assert main(["proof-report", "--profile", "proof_v2", "--results", str(folder), "--out", str(out),
                 "--rules", "v9"]) == 2
    assert V2.proof_distractor == 0.10
