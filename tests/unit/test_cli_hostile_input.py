"""More hostile input to the command line (an audit of README's "bad input exits 2 with one line naming
the key, file or line"): integers too long for Python to print, 100,000-character overrides, a malformed
or injected best-params file, and a prepared data folder that is not there."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT

from components.cli import main
from components.config import ConfigError, load_config
from components.search.errors import SearchError
from components.search.params_file import load_best_params

PARAMS = str(REPO_ROOT / "params.yaml")


def _err_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.strip() and "Traceback" not in line]


@pytest.mark.parametrize("number", ["9" * 5000, "-" + "9" * 5000, "0x" + "f" * 5000, "0" + "7" * 5000],
                         ids=["decimal", "negative", "hex", "leading-zero"])
def test_an_integer_too_long_to_print_is_a_yaml_error_naming_the_line(tmp_path: Path, number: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(f"gspo:\n  lr: {number}\n")
    with pytest.raises(ConfigError, match=r"p.yaml: not valid YAML: line 2, column 7: an integer of") as err:
        load_config(path)
    assert len(str(err.value)) < 300
    with pytest.raises(ConfigError, match="an integer of"):
        load_config(PARAMS, overrides=[f"gspo.lr={number}"])


def test_a_long_integer_in_the_opaque_section_is_refused_too(capsys: pytest.CaptureFixture[str]) -> None:
    # experiments.* is not typed here: config show printed it, and str() of 5000 hex digits raised
    assert main(["config", "show", "--params", PARAMS, "--set", "experiments.x=0x" + "f" * 5000]) == 2
    assert len(_err_lines(capsys)) == 1


def test_integers_within_the_bound_still_load() -> None:
    assert load_config(PARAMS, overrides=["gspo.steps=0x10"]).gspo.steps == 16
    with pytest.raises(ConfigError, match="less than or equal to"):
        load_config(PARAMS, overrides=["gspo.steps=" + "9" * 1000])


@pytest.mark.parametrize("override", ["model.name=[" + "x" * 100_000, "x" * 100_000 + "=1",
                                      "gspo." + "x" * 100_000, "gspo.steps='" + "x" * 100_000 + "'"],
                         ids=["bad-yaml", "unknown-section", "no-equals", "wrong-type"])
def test_a_huge_override_is_quoted_shortened(capsys: pytest.CaptureFixture[str], override: str) -> None:
    assert main(["config", "show", "--params", PARAMS, "--set", override]) == 2
    assert all(len(line) < 400 for line in _err_lines(capsys))


def test_a_malformed_best_params_file_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "best.yaml"
    bad.write_text("params:\n  gspo: [1, 2\n")
    with pytest.raises(SearchError, match=r"best.yaml: not valid YAML: line 3, column 1: expected ','") as err:
        load_best_params(bad)
    assert "\n" not in str(err.value)
    with pytest.raises(SearchError, match="is a folder, not a best-params file"):
        load_best_params(tmp_path)


@pytest.mark.parametrize("key", ["lr=5", "a.b", "1", "lr x"])
def test_a_best_params_key_cannot_smuggle_another_setting(tmp_path: Path, key: str) -> None:
    path = tmp_path / "best.yaml"
    path.write_text(f"params:\n  gspo:\n    '{key}': 1\n" if key != "1" else "params:\n  gspo:\n    1: 1\n")
    with pytest.raises(SearchError, match=r"params.gspo: .* is not a setting's name"):
        load_best_params(path)


def test_a_bad_best_params_value_names_the_best_params_file(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "best.yaml"
    path.write_text("params:\n  gspo:\n    lr: abc\n")
    assert main(["train", "--params", PARAMS, "--profile", "smoke", "--best-params", str(path),
                 "--out", str(tmp_path / "run"), "--no-track"]) == 2
    err = "\n".join(_err_lines(capsys))
    assert f"--best-params {path}" in err and "gspo.lr" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_validate_a_data_folder_that_is_not_there_is_one_line(tmp_path: Path, kind: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    if kind == "file":
        data.write_text("")
    reports = tmp_path / "reports"
    assert main(["validate", "--params", PARAMS, "--data", str(data), "--set", f"data.report_dir={reports}"]) == 2
    lines = _err_lines(capsys)
    assert len(lines) == 1 and str(data) in lines[0] and "agent-gspo prepare" in lines[0]
    assert not reports.exists()  # no report of thirteen "missing" splits
