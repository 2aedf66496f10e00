"""Every output option of every command, pointed at the pipeline's inputs -- the params file, the
prepared data's ``manifest.json``, the mirror's ``MANIFEST.json`` -- is exit 2 naming the option,
and every file of the project keeps its bytes. Also the outputs set through the config
(``search.out_params``, ``search.storage``, ``data.report_dir``) and folder outputs inside an input
(``prepare --out data/gsm8k``, ``prepare --out components``). The study's options (``experiments
report --out/--metrics``, ``experiments run --results``) go through its own entry point,
``experiments.cli.main``: ``agent-gspo experiments`` replaces the process with it (``os.execve``),
which would replace pytest here."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT, load_test_module

from components.cli import main
from experiments.cli import main as study_main

_digests = load_test_module("test_output_paths")._digests
project = load_test_module("test_output_paths").project

REPO = REPO_ROOT
TARGETS = ["params.yaml", "data/manifest.json", "mirror/MANIFEST.json"]
OPTIONS = {
    "prepare --out": ["prepare", "--out", "{t}"],
    "prepare --metrics": ["prepare", "--metrics", "{t}"],
    "rollout --json": ["rollout", "--benchmark", "gsm8k", "--json", "{t}"],
    "train --out": ["train", "--out", "{t}"],
    "train --metrics": ["train", "--metrics", "{t}"],
    "evaluate --out": ["evaluate", "--out", "{t}"],
    "evaluate --metrics": ["evaluate", "--metrics", "{t}"],
    "score --out": ["score", "--benchmark", "gsm8k", "--predictions", "{p}/preds.jsonl", "--out", "{t}"],
    "experiments report --out": ["experiments", "report", "--results", "{p}/results", "--out", "{t}"],
    "experiments report --metrics": ["experiments", "report", "--results", "{p}/results", "--metrics", "{t}"],
    "experiments run --results": ["experiments", "run", "--only", "baselines", "--results", "{t}"],
    "search --storage": ["search", "--no-track", "--storage", "sqlite:///{t}"],
    "search.out_params": ["search", "--no-track", "--set", "search.out_params={t}"],
}
FOLDERS = [  # (argv, the option the message names)
    (["prepare", "--out", "{p}/data/gsm8k"], "--out"),
    (["prepare", "--out", str(REPO / "components")], "--out"),
    (["prepare", "--out", "{p}/mirror"], "--out"),
    (["prepare", "--set", "data.report_dir={p}/mirror"], "data.report_dir"),
    (["validate", "--set", "data.report_dir={p}/data"], "data.report_dir"),
    (["train", "--out", str(REPO / "flows")], "--out"),
    (["evaluate", "--out", "{p}/mirror/gsm8k"], "--out"),
]


def _setup(project: Path, monkeypatch) -> None:  # noqa: F811 - the fixture's name
    import components.data.prepare as prepare
    from components.data.item import as_items

    row = {"id": "gsm8k/test/0", "benchmark": "gsm8k", "split": "test", "question": "q", "choices": None,
           "answer": "1", "answer_type": "numeric", "meta": {}}
    monkeypatch.setattr(prepare, "load_split", lambda *a, **k: as_items([row]))  # score: no prepared data needed
    (project / "mirror" / "MANIFEST.json").write_text('{"files": {}}\n')
    (project / "data" / "gsm8k").mkdir()
    (project / "data" / "gsm8k" / "test.parquet").write_bytes(b"PAR1")
    (project / "preds.jsonl").write_text("")
    (project / "results").mkdir()
    shutil.copy(REPO / "results" / next(p.name for p in (REPO / "results").glob("*.json")), project / "results")


def _run(project: Path, argv: list[str], target: str = "") -> tuple[int, str]:  # noqa: F811
    args = [a.replace("{t}", target).replace("{p}", str(project)) for a in argv]
    if args[0] == "experiments":
        return study_main([*args[1:], "--params", str(project / "params.yaml")]), " ".join(args)
    return main([*args, "--params", str(project / "params.yaml")]), " ".join(args)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(OPTIONS))
def test_output_option_at_a_pipeline_input_is_exit_2(project: Path, monkeypatch, capsys, name: str,  # noqa: F811
                                                     target: str) -> None:
    _setup(project, monkeypatch)
    before, repo_params = _digests(project), (REPO / "params.yaml").read_bytes()
    code, cmd = _run(project, OPTIONS[name], str(project / target))
    err = capsys.readouterr().err
    assert code == 2, f"{cmd}: exit {code}\n{err}"
    option = name.split()[-1] if " " in name else name
    assert option in err and target.split("/")[-1] in err, err
    assert "an input of the pipeline" in err or "mirror" in err, err
    assert _digests(project) == before, f"{cmd} changed a file"
    assert (REPO / "params.yaml").read_bytes() == repo_params


@pytest.mark.parametrize(("argv", "option"), FOLDERS)
def test_output_folder_inside_an_input_is_exit_2(project: Path, monkeypatch, capsys, argv: list[str],  # noqa: F811
                                                 option: str) -> None:
    _setup(project, monkeypatch)
    before = _digests(project)
    listing = {p: sorted(x.name for x in (REPO / p).iterdir()) for p in ("components", "flows")}
    code, cmd = _run(project, argv)
    err = capsys.readouterr().err
    assert code == 2 and option in err, f"{cmd}: exit {code}\n{err}"
    assert _digests(project) == before, f"{cmd} changed a file"
    assert listing == {p: sorted(x.name for x in (REPO / p).iterdir()) for p in ("components", "flows")}
