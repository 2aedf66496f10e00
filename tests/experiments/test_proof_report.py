"""The silence proof's verdicts (P1-P5) from a results file, and the P4 budget verdict with its
explanation: within the band with λ settled -> PASS, with λ clipped or still sweeping -> INCONCLUSIVE;
outside because no group had reward spread -> FAIL naming it; a slack cap -> FAIL naming that.
Built on the committed results file's shape, histories crafted."""

from __future__ import annotations

import json

import pytest
from helpers.paths import REPO_ROOT

from experiments.proof import ProofResults
from experiments.proof_report import proof_claims
from experiments.rules import V1

ROOT = REPO_ROOT


def _proof(tokens: list[float], lam: list[float], *, flat: bool, mode: str = "target") -> ProofResults:
    res = ProofResults.model_validate(json.loads((ROOT / "results" / "silence_proof.json").read_text()))
    history = [{"step": float(i + 1), "train/budget_tokens": t, "train/episodes": 8.0, "train/lambda_tok": lm,
                "gspo/kl_base": 0.5, "train/adv_groups": 1.0, "train/zero_adv_groups": 1.0 if flat else 0.0}
               for i, (t, lm) in enumerate(zip(tokens, lam, strict=True))]
    run = res.runs["agent_gspo"].model_copy(update={
        "history": history, "budget_calibration": {"episodes": 32.0, "fraction": 0.3, "measure": "completion",
                                                   "target": 13.2, "untrained_mean": 44.0}})
    return res.model_copy(update={"runs": {**res.runs, "agent_gspo": run},
                                  "recipe": {**res.recipe, "budget.mode": mode}})


def _p4(res: ProofResults):
    return next(c for c in proof_claims(res, V1) if c.key == "P4")


SETTLED = [0.4, 0.4, 0.3, 0.1, 0.02, -0.01, 0.01, 0.03, 0.0, -0.02, 0.01, 0.02]


def test_p4_passes_within_the_band_over_64_episodes_with_lambda_settled():
    p4 = _p4(_proof([30.0] * 4 + [13.0, 14.0, 12.5, 13.5, 13.0, 12.8, 13.9, 12.6], SETTLED, flat=False))
    assert p4.status == "PASS", p4.evidence
    assert ("last 64 training episodes: 13.2 tokens (-0.3% from B); standard error 0.20 tokens from the spread "
            "of its steps' means, against a band of ±1.32") in p4.evidence
    assert any(line.startswith("λ_tok settled: +0.020 -> +0.020") for line in p4.evidence), p4.evidence


def test_p4_inside_the_band_with_lambda_clipped_is_inconclusive():
    """λ at its ceiling in every judged step: the controller asked for fewer tokens than it got, the
    band was met by where the policy sat."""
    p4 = _p4(_proof([30.0] * 4 + [13.0, 14.0, 12.5, 13.5, 13.0, 12.8, 13.9, 12.6], [0.4] * 12, flat=False))
    assert p4.status == "INCONCLUSIVE", p4.evidence
    assert any("λ_tok was 0.400 in all 8 judged steps: clipped at a bound" in line for line in p4.evidence)


def test_p4_inside_the_band_while_lambda_sweeps_is_inconclusive():
    """The measured run C (target mode, adv_std_floor 0.2): -9.3 % from B while λ_tok swept from -0.13
    to -0.40 without raising token use."""
    tokens = [44.0] * 4 + [11.875, 11.875, 11.0, 15.375, 10.875, 11.625, 11.5, 11.75]
    lam = [0.4, 0.4, 0.4, 0.09, -0.127, -0.178, -0.229, -0.313, -0.231, -0.32, -0.38, -0.4]
    p4 = _p4(_proof(tokens, lam, flat=False))
    assert p4.status == "INCONCLUSIVE", p4.evidence
    assert any("λ_tok still moving: -0.127 -> -0.400 over the 8 judged steps, 34% of its range" in line
               for line in p4.evidence), p4.evidence


def test_p4_fails_and_says_no_group_had_reward_spread():
    lam = [0.4] * 4 + [0.2, 0.0, -0.2, -0.4, -0.4, -0.4, -0.4, -0.4]
    p4 = _p4(_proof([30.0] * 4 + [11.0] * 8, lam, flat=True))
    assert p4.status == "FAIL"
    text = " ".join(p4.evidence)
    assert "-16.7% from B" in text and "range [-0.400, 0.400], -0.400 at the last step (budget mode target)" in text
    assert "every group of the last 8 steps (8 of 8) gave all its episodes the same reward" in text


def test_p4_states_when_the_window_is_noisier_than_the_band():
    """Run I of the proof (2 questions x 8 episodes per step): the last 64 episodes are 4 steps whose
    means spread so widely that the window's standard error exceeds the band's half-width. Still FAIL:
    the noise is reported next to the verdict, it never changes it."""
    tokens = [30.0] * 8 + [13.7, 20.1, 24.1, 15.9]
    lam = [0.6] * 8 + [0.351, 0.179, 0.338, 0.503]
    res = _proof(tokens, lam, flat=False)
    run = res.runs["agent_gspo"]
    history = [h | {"train/episodes": 16.0} for h in run.history]
    calibration = {**run.budget_calibration, "fraction": 0.375, "target": 16.5}
    res = res.model_copy(update={"runs": {**res.runs, "agent_gspo": run.model_copy(
        update={"history": history, "budget_calibration": calibration})}})
    p4 = _p4(res)
    assert p4.status == "FAIL", p4.evidence
    assert any(line.startswith("last 64 training episodes: 18.4 tokens (+11.8% from B); standard error 2.30 tokens")
               and line.endswith("against a band of ±1.65") for line in p4.evidence), p4.evidence


def test_p4_fails_on_a_slack_cap_and_says_so():
    p4 = _p4(_proof([30.0] * 4 + [11.0] * 8, [0.5] * 8 + [0.49] * 4, flat=False, mode="cap"))
    assert p4.status == "FAIL"
    assert any("the cap is slack" in line for line in p4.evidence), p4.evidence


@pytest.mark.parametrize("key, status", [("P1", "PASS"), ("P2", "PASS"), ("P3", "PASS"), ("P4", "PASS"),
                                         ("P5", "REPORTED")])
def test_the_committed_file_gives_the_verdicts_the_readme_reports(key, status):
    res = ProofResults.model_validate(json.loads((ROOT / "results" / "silence_proof.json").read_text()))
    claim = next(c for c in proof_claims(res, V1) if c.key == key)
    assert claim.status == status and claim.evidence, claim


def test_the_recipe_records_real_config_keys_including_the_kl_penalty_and_std_floor():
    """A proof's results file records its training recipe from the flattened config: a misspelt key
    would be recorded as null, and a run with a KL penalty or a std floor must say so."""
    from components.config import load_config
    from experiments.proof import RECIPE_KEYS

    flat = load_config(str(ROOT / "params.yaml"), "proof", ["gspo.kl_beta=0.05"]).flat()
    assert [k for k in RECIPE_KEYS if k not in flat] == []
    assert {"gspo.kl_beta", "gspo.adv_std_floor", "model.silence_calibration"} <= set(RECIPE_KEYS)
    assert flat["gspo.kl_beta"] == 0.05


def test_p4_reports_the_rule_at_every_stopping_step_of_the_last_third_without_changing_the_verdict():
    """The committed run (Q): PASS at step 40, but inside the band at only 2 of the 14 stopping steps
    27-40, held by λ at 2, below B at 13. The line informs; the verdict stays the one at the end of
    training."""
    res = ProofResults.model_validate(json.loads((ROOT / "results" / "silence_proof.json").read_text()))
    p4 = _p4(res)
    assert p4.status == "PASS"
    assert ("the same rule had training stopped at each step from 27 to 40 (reported, not part of the verdict): "
            "inside the band at 2 of 14, held by λ at 2, below B at 13") in p4.evidence
    # a run that held B at every stopping step says so, and still passes on its own last window
    p4 = _p4(_proof([30.0] * 4 + [13.0, 14.0, 12.5, 13.5, 13.0, 12.8, 13.9, 12.6], SETTLED, flat=False))
    assert p4.status == "PASS"
    assert any(line.startswith("the same rule had training stopped at each step from 9 to 12") for line in p4.evidence)
