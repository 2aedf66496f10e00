"""Output options refuse paths that are inputs of the pipeline -- the params file, any
``manifest.json``, ``dvc.yaml``/``dvc.lock``, anything under ``data.out_dir``, ``data.mirror``,
``components/`` or ``flows/``, a symlink or hard link to one of them -- with exit 2 naming the option
and the path, before anything is written (one helper: ``components.io.check_not_pipeline_input``)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
import yaml
from helpers.paths import REPO_ROOT

from components.cli import main
from components.config import load_config
from components.errors import UserError
from components.io import check_not_pipeline_input, check_output_file

REPO = REPO_ROOT


@pytest.fixture()
def project(tmp_path: Path, monkeypatch) -> Path:
    """A params file whose data and mirror folders hold a manifest each; cwd = tmp_path."""
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["data"]["out_dir"], raw["data"]["mirror"] = "data", "mirror"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    for folder in ("data", "mirror"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "manifest.json").write_text("{}\n")
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _digests(root: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def _inputs(project: Path) -> list[Path]:
    os.symlink(project / "params.yaml", project / "link.yaml")
    os.link(project / "params.yaml", project / "hard.yaml")
    return [project / "params.yaml", project / "data" / "manifest.json", project / "mirror" / "manifest.json",
            project / "data" / "gsm8k" / "test.parquet", project / "mirror" / "new.json", project / "dvc.yaml",
            project / "dvc.lock", project / "experiments" / "dvc.lock", project / "link.yaml", project / "hard.yaml",
            REPO / "components" / "new.py", REPO / "flows" / "x.json", REPO / "experiments" / "gspo_b25.json",
            REPO / "params.yaml"]


def test_every_pipeline_input_is_refused_naming_the_option(project: Path) -> None:
    load_config(project / "params.yaml")
    for path in _inputs(project):
        with pytest.raises(UserError, match=f"--opt {path}: is .*an input of the pipeline"):
            check_not_pipeline_input(path, "--opt")
        with pytest.raises(UserError, match=f"metrics file \\(--metrics\\) {path}: is "):
            check_output_file(path, "metrics file (--metrics)")
    for fine in (project / "metrics.json", project / "results" / "r.json", project / "data.json"):
        check_output_file(fine, "--opt")


@pytest.mark.parametrize(("argv", "option"), [
    (["train", "--metrics", "{p}/params.yaml"], "--metrics"),
    (["train", "--metrics", "{p}/link.yaml"], "--metrics"),
    (["train", "--metrics", "{p}/data/manifest.json"], "--metrics"),
    (["evaluate", "--metrics", "{p}/params.yaml"], "--metrics"),
    (["evaluate", "--metrics", "{p}/mirror/manifest.json"], "--metrics"),
    (["prepare", "--metrics", "{p}/dvc.yaml"], "--metrics"),
    (["train", "--out", "{p}/mirror"], "--out"),
    (["evaluate", "--out", "{p}/data"], "--out"),
    (["rollout", "--benchmark", "gsm8k", "--json", "{p}/data/manifest.json"], "--json"),
    (["score", "--benchmark", "gsm8k", "--predictions", "{p}/preds.jsonl", "--out",
      "{p}/params.yaml"], "--out"),
])
def test_each_output_option_is_exit_2_and_writes_nothing(project: Path, capsys, monkeypatch, argv: list[str],
                                                         option: str) -> None:
    import components.data.prepare as prepare
    from components.data.item import as_items

    row = {"id": "gsm8k/test/0", "benchmark": "gsm8k", "split": "test", "question": "q", "choices": None,
           "answer": "1", "answer_type": "numeric", "meta": {}}
    monkeypatch.setattr(prepare, "load_split", lambda *a, **k: as_items([row]))  # score: no prepared data needed
    _inputs(project)
    (project / "preds.jsonl").write_text("")
    (project / "results").mkdir()
    shutil.copy(REPO / "results" / next(p.name for p in (REPO / "results").glob("*.json")), project / "results")
    before = _digests(project)
    args = [a.replace("{p}", str(project)) for a in argv]
    assert main([*args, "--params", str(project / "params.yaml")]) == 2
    err = capsys.readouterr().err
    target = args[args.index(option) + 1]
    assert option in err and f"{target}: is " in err and "an input of the pipeline" in err, err
    assert _digests(project) == before
