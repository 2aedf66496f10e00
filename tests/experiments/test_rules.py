"""The verdict rules are frozen, named versions: a committed version's thresholds never change (its hash
is pinned here: changing a rule means adding a version, and a line here), no version can be edited or
added at run time, a results set names the version that judges it, and every report prints it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from helpers.experiments_fixtures import baselines
from helpers.paths import REPO_ROOT

from components.errors import UserError
from experiments.claims import DEFAULT_RECORD, Record
from experiments.report import build_report
from experiments.results import write_results
from experiments.rules import RULES, SELECTIONS, V1, V2, rules_block, rules_of

ROOT = REPO_ROOT
PINNED = {
    "v1": "0a5fd1a9d9d187e24c00a744fda98a8a4a6ab6144e9697853d48ca8c34970cb6",
    "v2": "180bec7aa7778e0fe344443f6d8092fc00fa2047f4648fad4764faa8c0234460",
}
"""sha256 of each committed version's values: add a line for a new version, never edit one"""


def test_every_committed_version_keeps_its_thresholds() -> None:
    assert {name: rules.digest() for name, rules in RULES.items()} == PINNED


SELECTION_PINNED = {"s1": "f9ccf55d99b11dface422b433d711af6cb50cfe9dcb7083589f407def9ac5f6a"}
"""the same for the selection rules (experiments.devchoice): add a line for a new version, never edit one"""


def test_every_committed_selection_rule_keeps_its_values() -> None:
    """s1 was committed on 2026-12-07 before any dev result of devchoice1 existed (docs/experiments-log.md)."""
    assert {name: rule.digest() for name, rule in SELECTIONS.items()} == SELECTION_PINNED
    assert SELECTIONS["s1"].values() == {"confidence": 0.95, "tie_break": "tokens_total"}
    with pytest.raises(TypeError):
        SELECTIONS["s2"] = SELECTIONS["s1"]  # type: ignore[index]


def test_v1_are_the_thresholds_that_judged_the_committed_reports() -> None:
    assert V1.values() == {
        "token_share": 0.25, "target_share": 0.5, "lambda0_ratio": 2.0, "budget_tolerance": 0.10,
        "spread_margin": 0.25, "se_margin": 1.0, "collapse_share": 0.95, "kl_moved": 1e-3, "z_moved": 2.0,
        "window": 64, "drift": 0.25, "proof_silent_uninformed": 0.80, "proof_speaking_informed": 0.10,
        "proof_accuracy": 0.90, "proof_margin": 0.20, "proof_token_share": 0.50, "proof_band": 0.10}


def test_v2_adds_the_tests_of_issue_52_and_tightens_the_proof() -> None:
    """Pre-registered on 2026-12-06 before the proof_v2 runs existed (docs/experiments-log.md)."""
    values = V2.values()
    assert {k: values[k] for k in V1.values()} == {**V1.values(), "proof_silent_uninformed": 0.90,
                                                   "proof_token_share": 0.35}
    assert {k: v for k, v in values.items() if k not in V1.values()} == {
        "ni_margin": 0.05, "ni_confidence": 0.95, "power": 0.80, "chance_alpha": 0.05,
        "silence_collapse_share": 0.90, "proof_distractor": 0.10, "proof_seed_share": 0.75}


def test_versions_are_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        V1.token_share = 0.5  # type: ignore[misc]
    with pytest.raises(TypeError):
        RULES["v1"] = dataclasses.replace(V1, token_share=0.5)  # type: ignore[index]
    with pytest.raises(TypeError):
        RULES["v3"] = V1  # type: ignore[index]


def test_a_results_set_must_name_its_version() -> None:
    with pytest.raises(UserError, match=r"experiments.record.rules: not set"):
        rules_of(None)
    with pytest.raises(UserError, match=r"unknown verdict rule version 'v9' \(committed: v1, v2\)"):
        rules_of("v9")


def test_no_threshold_is_left_outside_the_registry() -> None:
    """The constants the verdicts once read from their modules are gone: one place holds them."""
    names = ("TOKEN_SHARE", "TARGET_SHARE", "LAMBDA0_RATIO", "BUDGET_TOLERANCE", "SPREAD_MARGIN", "KL_MOVED",
             "WINDOW", "DRIFT", "COLLAPSE_SHARE", "SILENT_UNINFORMED", "SPEAKING_INFORMED", "BAND")
    for path in (ROOT / "experiments").glob("*.py"):
        found = [n for n in names if re.search(rf"^{n}\b", path.read_text(), re.M)]
        assert not found, f"{path.name} defines {found}: thresholds live in experiments/rules.py"


def test_every_report_prints_the_version_and_its_thresholds(tmp_path: Path) -> None:
    write_results(tmp_path / "res" / "baselines.json", baselines())
    md = build_report(tmp_path / "res", tmp_path / "r.md", record=DEFAULT_RECORD).markdown
    assert rules_block("v1")[0] in md and "`token_share=0.25`" in md and "version `v1`" in md
    with pytest.raises(UserError, match="experiments.record.rules: not set"):
        build_report(tmp_path / "res", tmp_path / "s.md", record=Record())
    assert not (tmp_path / "s.md").exists()


@pytest.mark.parametrize("report", ["docs/results.md", "docs/results-cap128.md", "docs/results-reduced.md"])
def test_the_committed_reports_name_the_version_that_judged_them(report: str) -> None:
    assert rules_block("v2")[0] in (ROOT / report).read_text()
