"""The runs of record (``experiments.record``): the claims judge whichever experiments fill the roles,
and the project's target (claim f) returns PASS, FAIL, INCONCLUSIVE and NOT RUN."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.experiments_fixtures import baselines, history, trained
from helpers.paths import REPO_ROOT

from components.config import ConfigError, load_config
from experiments.claims import Record, claim_f
from experiments.jobs import ReportJob
from experiments.report import build_report
from experiments.results import write_results
from experiments.schema import study_section

ROOT = REPO_ROOT
MIX = Record(b25="gspo_b25_mix", b50="gspo_b50_mix", lambda0="lambda0_mix", no_adv_norm="no_adv_norm_mix",
             grpo_token="grpo_token_mix", rules="v1")


def _folder(folder: Path, suffix: str = "") -> Path:
    """The passing set of test_experiments_report.py, each trained run named ``<role><suffix>``."""
    b = 100.0
    for r in (baselines(),
              trained(f"gspo_b25{suffix}", 0.29, 20_000, history([150, 120, 104, 97, 101]), budget_target=b),
              trained(f"gspo_b50{suffix}", 0.31, 40_000, history([220, 200, 205, 195, 198]), budget_target=200.0,
                      fraction=0.5),
              trained(f"lambda0{suffix}", 0.30, 50_000, history([300, 310, 305, 320, 330])),
              trained(f"no_adv_norm{suffix}", 0.20, 21_000,
                      history([150, 90, 140, 60, 150], reward=[0.5, -0.6, 0.4, -0.7, 0.6]), budget_target=b),
              trained(f"grpo_token{suffix}", 0.15, 22_000, history([150, 130, 120, 118, 121]), budget_target=b)):
        write_results(folder / f"{r.name}.json", r)
    return folder


def _status(rep) -> dict[str, str]:
    return {c.key: c.status for c in rep.claims}


def test_the_claims_judge_the_runs_the_record_names(tmp_path):
    """The same numbers under other names give the same verdicts once the record names them, and the
    report says which experiment played which role; under the default names they are NOT RUN."""
    paper = _status(build_report(_folder(tmp_path / "paper"), tmp_path / "paper.md"))
    assert paper == {"a": "PASS", "b": "PASS", "c": "PASS", "d": "PASS", "e": "PASS", "f": "PASS"}
    mix = _folder(tmp_path / "mix", "_mix")
    unnamed = _status(build_report(mix, tmp_path / "unnamed.md"))
    assert {k: v for k, v in unnamed.items() if k != "c"} == dict.fromkeys("abdef", "NOT RUN")
    rep = build_report(mix, tmp_path / "mix.md", record=MIX)
    assert _status(rep) == paper
    assert ("Runs of record (`experiments.record`, not the paper's default names): B25 = `gspo_b25_mix`, "
            "B50 = `gspo_b50_mix`, λ=0 = `lambda0_mix`, no-adv-norm = `no_adv_norm_mix`, GRPO-token = "
            "`grpo_token_mix`.") in rep.markdown
    assert "| Agent-GSPO B25 | gspo_b25_mix |" not in rep.markdown  # the run's own label, in the role's row
    assert "| gspo_b25_mix | gspo_b25_mix |" in rep.markdown
    assert "Runs of record" not in build_report(_folder(tmp_path / "p2"), tmp_path / "p2.md").markdown


def test_a_record_pair_is_the_claim_not_evidence_beside_it(tmp_path):
    """lambda0_mix_answer / gspo_b25_mix_answer are listed in (b) as a like-for-like pair, not counted;
    when the record names them, (b) is judged on them and the pair is not listed a second time."""
    folder = tmp_path / "r"
    for r in (baselines(), trained("gspo_b25_mix_answer", 0.29, 20_000, history([104, 97, 101]), budget_target=100.0),
              trained("lambda0_mix_answer", 0.30, 50_000, history([300, 310, 305]))):
        write_results(folder / f"{r.name}.json", r)
    b = next(c for c in build_report(folder, tmp_path / "o.md").claims if c.key == "b")
    assert b.status == "NOT RUN"
    assert any(x.startswith("same recipe, not counted: lambda0_mix_answer") for x in b.evidence)
    record = Record(b25="gspo_b25_mix_answer", lambda0="lambda0_mix_answer", rules="v1")
    b = next(c for c in build_report(folder, tmp_path / "o.md", record=record).claims if c.key == "b")
    assert b.status == "PASS", b.evidence  # 50k vs 20k = 2.50x
    assert b.evidence[0].startswith("evaluation total tokens: lambda0_mix_answer 100000 vs gspo_b25_mix_answer 40000")
    assert not any(x.startswith("same recipe") for x in b.evidence)


@pytest.mark.parametrize(("acc", "tokens", "kl", "status", "verdict"), [
    (0.30, 45_000, 0.02, "PASS", "meets"),  # 0.45x at the same accuracy
    (0.30, 55_000, 0.02, "FAIL", "misses"),  # 0.55x
    (0.15, 30_000, 0.02, "FAIL", "misses"),  # 0.30x, accuracy 0.15 lower (SE ~0.05)
    (0.30, 45_000, 0.0, "INCONCLUSIVE", "meets"),  # meets it, but never moved from the base policy
])
def test_the_projects_target_f(tmp_path, acc, tokens, kl, status, verdict):
    results = {"baselines": baselines(), "gspo_b25": trained("gspo_b25", acc, tokens, history([100.0] * 3, kl_base=kl))}
    f = claim_f(results)
    assert f.status == status, f.evidence
    assert f.evidence[0].startswith(f"gspo_b25: total tokens {2 * tokens} vs 200000 = {tokens / 100_000:.2f}x "
                                    "(needs <= 0.5x") and f.evidence[0].endswith(f"-> {verdict} the target")
    assert claim_f({"gspo_b25": results["gspo_b25"]}).status == "NOT RUN"
    assert claim_f(results, Record(b25="other", rules="v1")).status == "NOT RUN"


def test_a_record_role_must_name_a_defined_experiment():
    cfg = load_config(ROOT / "params.yaml", "results", ["experiments.record.b25=gspo_b25_mix_answer"])
    record = study_section(cfg).record
    assert record.b25 == "gspo_b25_mix_answer" and record.b50 == "gspo_b50" and record.rules == "v2"
    with pytest.raises(ConfigError, match=r"record\.lambda0: unknown experiment 'lambda_0'"):
        study_section(load_config(ROOT / "params.yaml", "results", ["experiments.record.lambda0=lambda_0"]))
    with pytest.raises(ConfigError, match=r"experiments\.record\.b75: unknown key"):
        study_section(load_config(ROOT / "params.yaml", "results", ["experiments.record.b75=gspo_b25"]))
    with pytest.raises(ConfigError, match=r"experiments\.record\.rules: Input should be 'v1'"):
        study_section(load_config(ROOT / "params.yaml", "results", ["experiments.record.rules=v0"]))


def test_the_report_command_reads_the_record_from_the_config(tmp_path):
    folder = _folder(tmp_path / "mix", "_mix")
    overrides = [f"experiments.record.{role}={name}_mix" for role, name in
                 (("b25", "gspo_b25"), ("b50", "gspo_b50"), ("lambda0", "lambda0"), ("no_adv_norm", "no_adv_norm"),
                  ("grpo_token", "grpo_token"))]
    params = tmp_path / "params.yaml"
    params.write_text("experiments:\n  record: {rules: v1}\n  definitions:\n" + "".join(
        f"    {n}_mix: {{budget_fraction: 0.25}}\n" for n in ("gspo_b25", "gspo_b50", "no_adv_norm", "grpo_token"))
        + "    lambda0_mix: {}\n")
    cfg = load_config(params, None, overrides)
    rep = ReportJob(cfg=cfg, results=str(folder), out=str(tmp_path / "r.md")).run()
    assert _status(rep) == {"a": "PASS", "b": "PASS", "c": "PASS", "d": "PASS", "e": "PASS", "f": "PASS"}
