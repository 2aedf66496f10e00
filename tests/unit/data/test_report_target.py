"""``prepare --out OTHER`` and ``validate --data OTHER`` no longer replace the validation report that
``dvc.yaml`` tracks for ``data.out_dir`` (was: ``reports/validation.md`` silently overwritten with a
report of OTHER, found in issue 52's sessions): exit 2 naming ``data.report_dir``, nothing written,
and the documented ``--set data.report_dir=FOLDER`` still works."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT

from components.cli import main
from components.dvc_outputs import tracked_outputs

MIRROR = Path(os.environ.get("AGENT_GSPO_DATA_MIRROR", REPO_ROOT.parent / "shared" / "benchmarks"))
PIPELINE = """stages:
  validate:
    cmd: agent-gspo validate
    outs:
      - reports/validation.md
  sub:
    wdir: sub
    cmd: true
    outs:
      - out.txt:
          cache: false
    metrics:
      - m.json
"""


def test_tracked_outputs_are_each_stages_outs_metrics_and_plots_under_its_wdir(tmp_path: Path) -> None:
    (tmp_path / "dvc.yaml").write_text(PIPELINE)
    assert tracked_outputs(tmp_path) == {(tmp_path / p).resolve()
                                         for p in ("reports/validation.md", "sub/out.txt", "sub/m.json")}
    assert (REPO_ROOT / "reports" / "validation.md").resolve() in tracked_outputs(REPO_ROOT)
    (tmp_path / "dvc.yaml").write_text("stages: [not, a, mapping")
    assert tracked_outputs(tmp_path) == set()  # a broken pipeline file protects nothing (DVC says why)
    assert tracked_outputs(tmp_path / "nowhere") == set()


@pytest.fixture()
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder with the pipeline above and a tracked report of its data/."""
    (tmp_path / "dvc.yaml").write_text(PIPELINE)
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "validation.md").write_text("the report of data/\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _prepare(out: Path, *extra: str) -> int:
    return main(["prepare", "--params", str(REPO_ROOT / "params.yaml"), "--mirror", str(MIRROR), "--benchmarks",
                 "multiarith", "--out", str(out), "--set", "data.use_hub=false", *extra])


def test_prepare_into_another_folder_refuses_the_tracked_report(project: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert _prepare(project / "other") == 2
    err = capsys.readouterr().err
    assert "data.report_dir reports" in err and "dvc.yaml tracks" in err and "--set data.report_dir=" in err
    assert (project / "reports" / "validation.md").read_text() == "the report of data/\n"
    assert not (project / "other").exists()  # refused before anything was written

    assert _prepare(project / "other", "--set", f"data.report_dir={project / 'other-reports'}") == 0
    assert (project / "other-reports" / "validation.md").is_file()
    assert (project / "reports" / "validation.md").read_text() == "the report of data/\n"

    # validate --data OTHER: the same refusal; data.out_dir itself still writes the tracked report
    assert main(["validate", "--params", str(REPO_ROOT / "params.yaml"), "--data", str(project / "other")]) == 2
    assert "dvc.yaml tracks" in capsys.readouterr().err
    assert _prepare(project / "data") == 0
    assert "multiarith" in (project / "reports" / "validation.md").read_text()
