"""A recipe chosen on dev items by a frozen selection rule, then judged once on the test items (issue 52):
the rule picks the more accurate candidate only beyond noise and the cheaper one otherwise, it refuses
files that are not dev-set evaluations of the same items and settings, and the report refuses a test
file of the candidate the rule did not choose, or of another model."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.experiments_fixtures import SETTINGS, cell_of, columns, make_results

from experiments.cli import main
from experiments.devchoice import DevChoiceError, choose
from experiments.devchoice_report import DevChoiceInputs, build_devchoice_report
from experiments.results import ResultsFile, write_results
from experiments.rules import S1, selection_of

BENCHES = ("gsm8k", "svamp")
DEV = {"test_limit": 100, "benchmarks": {
    b: {"source": f"{b}/train", "split": "train", "pool": 1000, "n": 100, "seed": 5, "ids_sha256": str(i) * 64,
        "in_train_sources": False} for i, b in enumerate(BENCHES, 1)}}
ORDER = ("b25", "b50")


def _team(name: str, right: int, tokens: int, *, split: str = "devset", n: int = 100, ids: str = "e" * 64,
          seed: int = 2, per_item: bool = True, start: int = 0, **extra: object) -> ResultsFile:
    """A trained team right on ``right`` of ``n`` items per benchmark from item ``start``, ``tokens`` completion per
    item (``per_item`` False: only the cells, as files written before per-item outcomes were recorded)."""
    items = {b: columns([start <= i < start + right for i in range(n)], [tokens] * n) for b in BENCHES}
    more = {"eval_split": split, "devset": DEV} if split == "devset" else {}
    if not per_item:
        return make_results(name, {"agent_gspo": {b: cell_of(c) for b, c in items.items()}}, item_ids=ids, seed=seed,
                            trained_model=f"runs/devchoice1/{name}/final", **more, **extra)  # type: ignore[arg-type]
    return make_results(name, {}, items={"agent_gspo": items}, item_ids=ids, seed=seed,
                        trained_model=f"runs/devchoice1/{name}/final", **more, **extra)  # type: ignore[arg-type]


def _baselines() -> ResultsFile:
    def sys(right: int, tokens: int) -> dict:
        return {b: columns([i < right for i in range(100)], [tokens] * 100) for b in BENCHES}
    return make_results("baselines", {}, kind="baselines", item_ids="f" * 64, items={
        "single_cot": sys(20, 50), "self_consistency": sys(22, 250), "mas_untrained": sys(30, 400)})


def test_a_difference_beyond_noise_picks_the_more_accurate_candidate() -> None:
    more = choose({"b25": _team("b25", 20, 100), "b50": _team("b50", 60, 300)}, ORDER, S1)
    assert more.chosen == "b50" and more.difference.low > 0 and "more accurate beyond noise" in more.reason
    less = choose({"b25": _team("b25", 60, 300), "b50": _team("b50", 20, 100)}, ORDER, S1)
    assert less.chosen == "b25" and less.difference.high < 0


def test_an_interval_covering_zero_picks_the_cheaper_and_the_first_on_a_tie() -> None:
    # 30 vs 32 right of 100, on items that overlap in part: the paired interval covers 0, so tokens decide
    cheaper_b = choose({"b25": _team("b25", 30, 200), "b50": _team("b50", 32, 100, start=20)}, ORDER, S1)
    assert cheaper_b.difference.low < 0 < cheaper_b.difference.high
    assert cheaper_b.chosen == "b50" and "covering 0" in cheaper_b.reason
    assert choose({"b25": _team("b25", 32, 100), "b50": _team("b50", 30, 200, start=20)}, ORDER, S1).chosen == "b25"
    assert choose({"b25": _team("b25", 30, 100), "b50": _team("b50", 30, 100)}, ORDER, S1).chosen == "b25"


@pytest.mark.parametrize(("b50", "match"), [
    (lambda: _team("b50", 30, 100, split="test"), "evaluated on 'test', not on the dev set"),
    (lambda: _team("b50", 30, 100, ids="9" * 64), "other items"),
    (lambda: _team("b50", 30, 100, settings=SETTINGS | {"mas.max_message_tokens": 64}), "mas.max_message_tokens"),
    (lambda: _team("b50", 30, 100, per_item=False), "no per-item outcomes"),
])
def test_files_the_choice_cannot_rest_on_are_refused_by_name(b50: object, match: str) -> None:
    with pytest.raises(DevChoiceError, match=match):
        choose({"b25": _team("b25", 30, 100), "b50": b50()}, ORDER, S1,  # type: ignore[operator]
               {"b25": "dev/b25.json", "b50": "dev/b50.json"})


def test_a_missing_candidate_and_an_unknown_rule_version_are_named() -> None:
    with pytest.raises(DevChoiceError, match="dev/b50.json: no dev results file for candidate 'b50'"):
        choose({"b25": _team("b25", 30, 100)}, ORDER, S1, {"b50": "dev/b50.json", "b25": "dev/b25.json"})
    with pytest.raises(Exception, match="unknown selection rule version 's9'"):
        selection_of("s9")


def _layout(tmp_path: Path, test: ResultsFile | None = None) -> tuple[Path, Path, Path]:
    dev, tst, base = tmp_path / "dev", tmp_path / "test", tmp_path / "baselines.json"
    write_results(dev / "b25.json", _team("b25", 30, 100))
    write_results(dev / "b50.json", _team("b50", 31, 200))
    write_results(base, _baselines())
    tst.mkdir()
    if test is not None:
        write_results(tst / f"{test.name}.json", test)
    return dev, tst, base


def _report(tmp_path: Path, dev: Path, tst: Path, base: Path) -> dict[str, bool | None]:
    return build_devchoice_report(DevChoiceInputs(dev, tst, base, ORDER, "s1", "v2"), tmp_path / "out.md", "cmd")


def test_the_report_says_the_test_touch_has_not_run_before_it_has(tmp_path: Path) -> None:
    assert _report(tmp_path, *_layout(tmp_path)) == {}
    text = (tmp_path / "out.md").read_text()
    assert "**Chosen: b25**" in text and "Not run yet: no `b25.json`" in text and "Selection rule: version `s1`" in text


def test_the_test_touch_is_judged_by_the_registered_predictions(tmp_path: Path) -> None:
    test = _team("b25", 29, 100, split="test", ids="f" * 64, silence={"agent_gspo": {
        "silent": [[0, 0], [95, 0], [99, 0]], "sent": [[200, 200], [200, 10], [200, 5]],
        "by_benchmark": {b: {"silent": [[0, 0], [95, 0], [99, 0]], "sent": [[100, 100], [100, 5], [100, 2]]}
                         for b in BENCHES}}})
    preds = _report(tmp_path, *_layout(tmp_path, test))
    # team 29 % at 400 total tokens per item (completion 100 x 3 = 300 + ... ) vs the untrained team's 1200
    assert preds["P1 tokens"] is True
    assert preds["P3 CoT more accurate per token"] is True  # CoT: 20 % at 150 tokens per item
    assert preds["P4 collapse"] is False  # 2 of 2 benchmarks collapsed, but 5 were registered
    assert preds["P2 non-inferior"] is not None
    text = (tmp_path / "out.md").read_text()
    assert "## The test touch" in text and "Above chance?" not in text  # no multiple-choice benchmark here
    assert (tmp_path / "out" / "accuracy_tokens.png").stat().st_size > 0


@pytest.mark.parametrize(("test", "match"), [
    (lambda: _team("b50", 30, 100, split="test", ids="f" * 64), "the candidate the rule did not choose"),
    (lambda: _team("b25", 30, 100, ids="f" * 64), "evaluated on 'devset'"),
    (lambda: _team("b25", 30, 100, split="test", ids="7" * 64), "other items"),
    (lambda: _team("b25", 30, 100, split="test", ids="f" * 64, seed=0), "is not the one chosen on the dev items"),
    (lambda: _team("b25", 30, 100, split="test", ids="f" * 64, settings=SETTINGS | {"mas.rounds": 3}),
     "settings differ \\(mas.rounds: 3 vs 2\\)"),
])
def test_a_test_file_that_is_not_the_chosen_models_one_touch_is_refused(tmp_path: Path, test: object,
                                                                         match: str) -> None:
    with pytest.raises(DevChoiceError, match=match):
        _report(tmp_path, *_layout(tmp_path, test()))  # type: ignore[operator]
    assert not (tmp_path / "out.md").exists()


def test_cli_prints_the_predictions_and_exits_2_on_bad_input(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    dev, tst, base = _layout(tmp_path)
    args = ["devchoice-report", "--dev", str(dev), "--test", str(tst), "--baselines", str(base),
            "--selection", "s1", "--rules", "v2", "--out", str(tmp_path / "r.md")]
    assert main([*args, "--candidates", "b25,b50"]) == 0
    assert "outputs:" in capsys.readouterr().out
    assert main([*args, "--candidates", "b25"]) == 2
    assert "--candidates: name exactly two" in capsys.readouterr().err
    assert main([*args, "--candidates", "b25,b50", "--rules", "v1"]) == 2
    assert "v2 or later" in capsys.readouterr().err
    assert main([*args[:2], str(tmp_path / "nope"), *args[3:], "--candidates", "b25,b50"]) == 2
    assert "not a folder" in capsys.readouterr().err
