"""The report's rules can fail: paired accuracy differences, "did the run move", budget tracking
over >= 64 episodes. Each rule is shown returning PASS, FAIL and INCONCLUSIVE on synthetic files."""

from __future__ import annotations

import json
import math

import pytest
from helpers.experiments_fixtures import baselines, cell, columns, history, make_results, trained

from experiments.claims import all_claims
from experiments.results import ResultsFileError, load_results, write_results
from experiments.rules import V1
from experiments.stats import (
    ItemColumns,
    controller_settled,
    last_episodes,
    movement,
    paired,
    paired_macro,
    rule_at_endings,
    window_standard_error,
)

N = 100
BASE_CORRECT = [i % 10 < 3 for i in range(N)]  # 30 % correct, the same items every time


def _status(results) -> dict[str, str]:
    return {c.key: c.status for c in all_claims(results)}


def _base_with_items(completion: int = 40):
    b = baselines()
    items = {"mas_untrained": {bench: columns(BASE_CORRECT, [completion] * N) for bench in ("gsm8k", "svamp")}}
    return make_results("baselines", {k: {b2: c.model_dump() for b2, c in v.items()} for k, v in b.eval.items()},
                        kind="baselines", items=items)


def _trained_with_items(name: str, correct: list[bool], completion: list[int], **kw):
    acc = sum(correct) / N
    items = {"agent_gspo": {b: columns(correct, completion) for b in ("gsm8k", "svamp")}}
    return trained(name, acc, 20_000, items=items, **kw)


def test_paired_difference_and_its_standard_error():
    assert paired([1, 1, 0, 0], [1, 0, 0, 0]) == pytest.approx((0.25, 0.25))
    assert paired([1, 0], [1, 0]) == (0.0, 0.0)
    with pytest.raises(ValueError, match="same items"):
        paired([1, 0], [1])
    a = {"x": ItemColumns(correct=[True, False], tokens_total=[1, 1], tokens_completion=[1, 1])}
    assert paired_macro(a, {"y": a["x"]}) is None  # no shared benchmark


def test_paired_rule_fails_a_loss_that_the_unpaired_error_would_hide():
    """The trained MAS loses 3 of the untrained MAS's 30 correct items and gains none: -0.03 with a
    paired SE of 0.017 is a loss; sqrt(se_a² + se_b²) = 0.064 would have called it a tie (PASS)."""
    lost = [c and i not in (0, 1, 2) for i, c in enumerate(BASE_CORRECT)]
    results = {"baselines": _base_with_items(), "gspo_b25": _trained_with_items("gspo_b25", lost, [5] * N,
                                                                                 hist=history([10, 10, 10]))}
    claim = all_claims(results)[0]
    assert claim.status == "FAIL", claim.evidence
    assert "paired over 200 shared items" in claim.evidence[0] and "-0.030" in claim.evidence[0]
    unpaired = {"baselines": baselines(), "gspo_b25": trained("gspo_b25", 0.27, 20_000, hist=history([10, 10, 10]))}
    assert all_claims(unpaired)[0].status == "PASS"  # the lenient rule the paired one replaces


def test_paired_rule_passes_an_equal_accuracy_at_a_fifth_of_the_tokens():
    results = {"baselines": _base_with_items(), "gspo_b25": _trained_with_items("gspo_b25", BASE_CORRECT, [5] * N,
                                                                                 hist=history([10, 10, 10]))}
    claim = all_claims(results)[0]
    assert claim.status == "PASS" and "+0.000" in claim.evidence[0], claim.evidence


def test_runs_that_did_not_move_make_every_comparison_inconclusive():
    """KL from the base 1e-4 and no per-item tokens: (a) would pass, (b), (d), (e) compare two
    unmoved runs - none of them may PASS."""
    flat = dict(kl_base=1e-4)
    results = {"baselines": baselines(),
               "gspo_b25": trained("gspo_b25", 0.29, 20_000, history([150, 120, 104, 97, 101], **flat),
                                   budget_target=100.0),
               "lambda0": trained("lambda0", 0.30, 50_000, history([300, 310, 305, 320, 330], **flat)),
               "no_adv_norm": trained("no_adv_norm", 0.20, 21_000,
                                      history([150, 90, 140, 60, 150], reward=[0.5, -0.6, 0.4, -0.7, 0.6], **flat),
                                      budget_target=100.0),
               "grpo_token": trained("grpo_token", 0.15, 22_000, history([150, 130, 120, 118, 121], **flat),
                                     budget_target=100.0)}
    status = _status(results)
    assert status == {"a": "INCONCLUSIVE", "b": "INCONCLUSIVE", "c": "PASS", "d": "INCONCLUSIVE",
                      "e": "INCONCLUSIVE", "f": "INCONCLUSIVE"}, status
    e = next(c for c in all_claims(results) if c.key == "e")
    assert any("gspo_b25 did not move" in line and "at most 0.0001" in line for line in e.evidence)


def test_held_out_tokens_beyond_two_paired_errors_count_as_movement():
    less = [40 - (i % 7) for i in range(N)]  # ~3 tokens fewer per item, a few tokens of spread
    m = movement(history([1.0], kl_base=0.0), {"g": ItemColumns(correct=BASE_CORRECT, tokens_total=less,
                                                                  tokens_completion=less)},
                 {"g": ItemColumns(correct=BASE_CORRECT, tokens_total=[40] * N, tokens_completion=[40] * N)}, V1)
    assert m.moved and "changed by -3.0" in m.why
    same = movement([], {"g": ItemColumns(correct=[True], tokens_total=[40], tokens_completion=[40])},
                    {"g": ItemColumns(correct=[True], tokens_total=[40], tokens_completion=[40])}, V1)
    assert not same.moved and "no KL from the base logged" in same.why


def test_budget_rule_needs_64_episodes_and_is_two_sided():
    def status(hist):
        return _status({"gspo_b25": trained("gspo_b25", 0.3, 1000, hist, budget_target=100.0)})["c"]

    assert status(history([100, 101, 99], episodes=22)) == "PASS"  # 66 episodes, +0 %
    assert status(history([100, 101, 99], episodes=8)) == "INCONCLUSIVE"  # 24 episodes: cannot judge
    assert status(history([172, 170, 175], episodes=4)) == "FAIL"  # too few, but every step far above B
    assert status(history([80, 85, 85], episodes=22)) == "FAIL"  # 16.7 % under B fails too (two-sided)
    assert status(history([120, 125, 125], episodes=22)) == "FAIL"
    mean, n = last_episodes(history([50, 100, 200], episodes=40), "train/budget_tokens", 64)
    assert (mean, n) == (150.0, 80)  # the last two steps: the first with 64+ episodes
    assert last_episodes([{"train/budget_tokens": 1.0}], "train/budget_tokens", 64) == (None, 0)


def test_window_standard_error_is_the_spread_of_the_judged_steps_means():
    hist = history([500, 10, 20, 30], episodes=32)  # the last two steps hold 64 episodes
    assert window_standard_error(hist, "train/budget_tokens", 64) == pytest.approx(math.sqrt(50.0) / math.sqrt(2))
    assert window_standard_error(history([10], episodes=64), "train/budget_tokens", 64) is None  # one step: no spread
    nan = history([10, float("nan")], episodes=32)
    assert window_standard_error(nan, "train/budget_tokens", 64) is None


def test_budget_rule_inside_the_band_needs_a_settled_controller():
    def status(hist):
        return _status({"gspo_b25": trained("gspo_b25", 0.3, 1000, hist, budget_target=100.0)})["c"]

    def with_lambda(lam):
        return [h | {"train/lambda_tok": x} for h, x in zip(history([150, 120, 100, 101, 99]), lam, strict=True)]

    assert status(with_lambda([0.1, 0.3, 0.25, 0.27, 0.26])) == "PASS"
    assert status(with_lambda([0.1, 0.5, 0.5, 0.5, 0.5])) == "INCONCLUSIVE"  # clipped at λ_max in the window
    claim = next(c for c in all_claims({"gspo_b25": trained("gspo_b25", 0.3, 1000, with_lambda(
        [0.5, 0.4, 0.3, 0.2, 0.1]), budget_target=100.0)}) if c.key == "c")
    assert claim.status == "INCONCLUSIVE"  # still sweeping down through the judged steps
    assert any("λ_tok still moving: +0.300 -> +0.100" in line and "not held by λ" in line for line in claim.evidence)
    assert status(with_lambda([0.1, 0.5, 0.5, 0.5, 0.5])[:3] + history([130, 130], episodes=22)) == "FAIL"

    # claim (c) reports the rule at every stopping step of the last third for the runs it counts
    hist = with_lambda([0.1, 0.3, 0.25, 0.27, 0.26])
    claim = next(c for c in all_claims({"gspo_b25": trained("gspo_b25", 0.3, 1000, hist, budget_target=100.0),
                                        "grpo_token": trained("grpo_token", 0.3, 1000, hist, budget_target=100.0)})
                 if c.key == "c")
    assert claim.status == "PASS"
    assert "gspo_b25: the same rule had training stopped at each step from 4 to 5 (reported, not part of the " \
           "verdict): inside the band at 2 of 2, held by λ at 2, below B at 0" in claim.evidence
    assert not any(line.startswith("grpo_token: the same rule") for line in claim.evidence)  # not counted


def test_controller_settled_rule():
    def hist(lam, episodes=8.0):
        return [{"train/budget_tokens": 10.0, "train/episodes": episodes, "train/lambda_tok": x} for x in lam]

    ok, why = controller_settled(hist([0.5, 0.0] + [0.1, 0.12] * 4), V1)
    assert ok and "settled: +0.100 -> +0.120" in why
    assert controller_settled(hist([0.5] * 10), V1)[0] is False          # clipped (or the dual off)
    assert controller_settled(hist([0.0, 0.5] + [0.1] * 8), V1)[0] is False  # a slack cap: λ at λ_min
    ok, why = controller_settled(hist([0.4, 0.4, 0.3, 0.2, 0.1, 0.0, -0.1, -0.2, -0.3, -0.4]), V1)
    assert ok is False and "+0.300 -> -0.400 over the 8 judged steps, 87% of its range" in why
    assert controller_settled(hist([0.5, 0.1], episodes=40), V1)[0] is False  # two steps, still moving
    assert controller_settled([{"train/budget_tokens": 1.0, "train/episodes": 64.0}], V1) == (
        None, "λ_tok not logged for the judged steps")
    ok, why = controller_settled(hist([0.1, 0.3, 0.48, 0.49, 0.498, 0.5, 0.5, 0.5, 0.5, 0.5]), V1)  # proof seed 1
    assert ok is False and "sat at 0.500, the edge of its range over the run (a clip), in 5 of 8" in why
    assert controller_settled(hist([0.1, 0.3, 0.48, 0.5, 0.49, 0.5, 0.47, 0.46, 0.48, 0.49]), V1)[0] is True  # 2 of 8
    assert controller_settled(hist([0.5, 0.0] + [0.1, math.nan] * 4), V1)[0] is None  # a crafted or broken log
    assert controller_settled(hist([math.inf, 0.0] + [0.1, 0.12] * 4), V1)[0] is None


def test_a_one_sided_error_is_not_a_settled_controller():
    """Run F of the proof: λ fell steadily from -0.73 to -1.00 over the window while use stayed 27 % under
    B; the net change is only 13 % of the [-1, +1] range λ covered, so the drift test alone passed it."""
    lam = [1.0, 0.5, 0.0, -0.5, -0.731, -0.79, -0.842, -0.897, -0.952, -0.999, -1.0, -0.98]
    def hist(tokens):
        return [{"train/budget_tokens": t, "train/budget": 16.5, "train/episodes": 8.0, "train/lambda_tok": x}
                for t, x in zip(tokens, lam, strict=True)]

    ok, why = controller_settled(hist([30.0] * 4 + [12.0] * 8), V1)
    assert ok is False and "token use was below B in all 8 judged steps" in why and "-0.731 -> -0.980" in why
    ok, why = controller_settled(hist([5.0] * 4 + [17.0] * 8), V1)
    assert ok is False and "above B in all 8" in why
    assert controller_settled(hist([30.0] * 4 + [12.0, 17.0] * 4), V1)[0] is True  # errors of both signs: held
    no_b = [{k: v for k, v in h.items() if k != "train/budget"} for h in hist([30.0] * 4 + [12.0] * 8)]
    assert controller_settled(no_b, V1)[0] is True  # B not logged: this test cannot judge, the others passed


def test_fixture_cell_is_consistent():
    c = cell(0.3, 1000)
    assert math.isclose(c["accuracy"], 0.3) and c["tokens_total"] == 1000


def _edit(raw: dict, path: str, value) -> dict:
    *keys, last = path.split(".")
    node = raw
    for k in keys:
        node = node[int(k)] if isinstance(node, list) else node[k]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return raw


@pytest.mark.parametrize("path, value, expected", [
    ("items.agent_gspo.gsm8k.correct", [True] * (N - 1), "one entry per item (lengths 99, 100, 100)"),
    ("items.agent_gspo.gsm8k.tokens_total.0", -5, "greater than or equal to 0"),
    ("items.agent_gspo.gsm8k.tokens_completion.0", 10**6, "tokens_completion exceeds its tokens_total"),
    ("items.agent_gspo.gsm8k.correct.0", True, "disagrees with eval.agent_gspo.gsm8k"),
    ("items.agent_gspo.nope", columns([True] * 3), "no eval.agent_gspo.nope cell"),
    ("budget.target", 0.0, "budget.target"),
])
def test_a_file_whose_items_and_cells_disagree_is_refused_naming_the_key(tmp_path, path, value, expected):
    """Paired statistics read the per-item columns, the tables read the cells: a hand-edited or
    truncated file where they disagree (or with B = 0, which the budget rule divides by) is refused."""
    ok = _trained_with_items("gspo_b25", [False] + BASE_CORRECT[1:], [5] * N, hist=history([10, 10, 10]),
                             budget_target=50.0)
    path_ok = write_results(tmp_path / "gspo_b25.json", ok)
    assert load_results(path_ok) == ok
    raw = _edit(json.loads(path_ok.read_text()), path, value)
    path_ok.write_text(json.dumps(raw))
    with pytest.raises(ResultsFileError, match="gspo_b25.json") as err:
        load_results(path_ok)
    assert expected in str(err.value), err.value


def test_the_budget_rule_at_every_stopping_step_counts_inside_held_and_below():
    """12 steps of 16 episodes, B 20: the last third (steps 9-12) is judged as if training had stopped
    there, each over its last 4 steps (64 episodes)."""
    def hist(tokens, lam):
        return [{"train/budget_tokens": t, "train/budget": 20.0, "train/episodes": 16.0, "train/lambda_tok": x}
                for t, x in zip(tokens, lam, strict=True)]

    # a controller regulating around B: use on both sides, λ moving a little inside a wide range
    centred = hist([60, 40, 30] + [21, 19] * 4 + [21], [0.1, 0.6, 0.5] + [0.20, 0.22] * 4 + [0.21])
    e = rule_at_endings(centred, 20.0, 0.10, V1)
    assert (e.first_step, e.last_step, e.judged, e.inside, e.held, e.below) == (9, 12, 4, 4, 4, 0)
    assert "at each step from 9 to 12" in e.text() and "inside the band at 4 of 4, held by λ at 4" in e.text()
    # the policy settled 15 % under B while λ wound down: outside the band at every stopping step
    under = hist([60, 40, 30] + [17.0] * 9, [0.6, 0.6, 0.6, 0.5, 0.45, 0.4, 0.35, 0.3, 0.25, 0.2, 0.15, 0.1])
    e = rule_at_endings(under, 20.0, 0.10, V1)
    assert (e.judged, e.inside, e.held, e.below) == (4, 0, 0, 4)
    # inside the band at the end, but below B in every judged step while λ swept: inside, never held
    sweep = hist([60, 40, 30] + [18.5] * 9, [0.6, 0.6, 0.6, 0.5, 0.45, 0.4, 0.35, 0.3, 0.25, 0.2, 0.15, 0.1])
    e = rule_at_endings(sweep, 20.0, 0.10, V1)
    assert (e.judged, e.inside, e.held, e.below) == (4, 4, 0, 4)
    # one noisy window: only the endings whose 4-step mean leaves the band count as outside
    noisy = hist([60, 40, 30, 20, 20, 20, 20, 20, 8, 20, 20, 20], [0.6, 0.6, 0.5] + [0.2, 0.21] * 4 + [0.2])
    e = rule_at_endings(noisy, 20.0, 0.10, V1)
    assert (e.judged, e.inside, e.below) == (4, 0, 4)  # 8 sits in every window ending at steps 9-12 (17.0: -15 %)
    assert rule_at_endings(noisy[:3], 20.0, 0.10, V1) is None  # 48 episodes: no window to judge
    assert rule_at_endings(centred, math.nan, 0.10, V1) is None and rule_at_endings(centred, 0.0, 0.10, V1) is None
    assert rule_at_endings([], 20.0, 0.10, V1) is None
