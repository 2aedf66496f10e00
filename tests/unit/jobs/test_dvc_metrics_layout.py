"""`dvc metrics show` stays readable (< 120 columns) and the training series is a DVC plot (x = step)."""

from __future__ import annotations

import contextlib
import csv
import io
import json
from pathlib import Path

import yaml
from helpers.paths import REPO_ROOT

from components.jobs.metrics import (
    COLUMNS,
    SERIES_COLUMNS,
    SERIES_FILE,
    data_metrics,
    train_metrics,
    write_eval_metrics,
    write_metrics,
)

ROOT = REPO_ROOT

HISTORY = [{"step": float(s), "train/reward": -0.2 * s, "train/accuracy": 0.1, "train/tokens_total": 2516.0 + s,
            "train/budget_tokens": 170.0, "train/budget": 120.0, "train/lambda_tok": 0.1 * s,
            "train/silence_rate": 0.0, "gspo/zero_adv_groups_frac": 1.0, "gspo/grad_norm": 0.0, "gspo/loss": 0.0,
            "gspo/approx_kl": 0.0, "gspo/noop_step": float(s < 3)} for s in (1, 2, 3)]
SUMMARY = {name: {"accuracy": 0.142857142857, "accuracy_micro": 0.14, "n": 7, "tokens_total": 10550,
                  "tokens_total_mean": 1507.142857, "tokens_completion": 1023, "tokens_communicated": 1126,
                  "silence_rate": 0.0, "grading_errors": 0}
           for name in ("agent_gspo", "mas_untrained", "mas_prior", "self_consistency", "single_cot")}


def _smoke_metric_files(tmp_path: Path) -> dict[str, dict]:
    manifest = {"benchmarks": {b: {"rows": {"train": 7000, "test": 1000}} for b in ("gsm8k", "mmlu", "aqua")}}
    write_metrics(tmp_path / "metrics/data.json", data_metrics(manifest))
    write_metrics(tmp_path / "metrics/train.json", train_metrics(HISTORY))
    write_eval_metrics(tmp_path / "metrics/eval", SUMMARY)
    return {str(p.relative_to(tmp_path)): {"data": json.loads(p.read_text())}
            for p in sorted((tmp_path / "metrics").rglob("*.json"))}


def test_dvc_metrics_show_of_the_smoke_chain_fits_120_columns(tmp_path: Path) -> None:
    from dvc.compare import show_metrics

    files = _smoke_metric_files(tmp_path)
    assert len(files) == 2 + len(SUMMARY)
    assert {k for f in files.values() for k in f["data"]} <= set(COLUMNS)  # one shared vocabulary
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        show_metrics({"workspace": {"data": files}})
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 + len(files)
    assert max(len(line) for line in lines) <= 120, out.getvalue()
    assert files["metrics/train.json"]["data"] == {"n": 3, "accuracy": 0.1, "tokens": 2519.0, "silence": 0.0,
                                                   "reward": -0.6, "lambda_tok": 0.3, "budget": 120.0, "noop": 2}
    assert files["metrics/eval/agent_gspo.json"]["data"] == {"n": 7, "accuracy": 0.1429, "tokens": 1507.1429,
                                                            "silence": 0.0}


def test_the_eval_metrics_folder_holds_this_evaluation_only(tmp_path: Path) -> None:
    write_eval_metrics(tmp_path, SUMMARY)
    write_eval_metrics(tmp_path, {"agent_gspo": SUMMARY["agent_gspo"]})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent_gspo.json"]


def test_the_train_job_writes_the_series_file(tmp_path: Path, monkeypatch) -> None:
    from components.config import load_config
    from components.jobs import TrainJob
    from components.runtime.training_run import TrainResult

    monkeypatch.setattr(TrainJob, "_train", lambda self: TrainResult(tmp_path / "run", None, 3, HISTORY))
    TrainJob(cfg=load_config(profile="smoke"), out_dir=str(tmp_path / "run"), track=False,
             metrics_file=str(tmp_path / "train.json")).run()
    rows = list(csv.DictReader((tmp_path / "run" / SERIES_FILE).open()))
    assert list(rows[0]) == list(SERIES_COLUMNS)
    assert [r["step"] for r in rows] == ["1", "2", "3"]
    assert rows[2]["reward"] == "-0.6" and rows[2]["lambda_tok"] == "0.3" and rows[0]["tokens"] == "2517.0"


def test_dvc_yaml_declares_the_series_as_a_plot_over_steps() -> None:
    from components.config import load_config

    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    series = f"{load_config(profile='smoke').gspo.out_dir}/{SERIES_FILE}"
    train = spec["stages"]["train"]
    assert series in [p if isinstance(p, str) else next(iter(p)) for p in train["plots"]]
    plots = {name: p for entry in spec["plots"] for name, p in entry.items()}
    assert plots["training"]["x"] == "step"
    ys = plots["training"]["y"][series]
    assert ys and set(ys) <= set(SERIES_COLUMNS)
    evaluate = spec["stages"]["evaluate"]
    assert "--metrics metrics/eval" in evaluate["cmd"]
    assert [next(iter(m)) for m in evaluate["metrics"]] == ["metrics/eval"]
