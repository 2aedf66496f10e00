"""The study's jobs: run the paper's experiments, and regenerate their report from the results files.

Jobs like the product's (:class:`components.jobs.base.Job`: one validated config in, one typed
result out), but the study's: the product's job registry (``components.jobs``) does not list them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from components.errors import UserError
from components.io import check_output_file
from components.jobs.base import Job
from components.jobs.metrics import write_metrics
from experiments.report import ReportOutput, build_report
from experiments.results import ResultsFile, load_results_dir
from experiments.runner import ExperimentOutcome, RunRequest, run_experiments
from experiments.schema import study_section


class ExperimentsJob(Job):
    """``agent-gspo experiments run``: train / evaluate each selected experiment, write ``results/<name>.json``."""

    KIND = "experiments"
    only: list[str] | None = Field(None, description="experiment names (default: all)")
    limit: int | None = Field(None, ge=1, description="items per benchmark (overrides eval.limit)")
    results_dir: str | None = Field(None, description="results folder (default experiments.results_dir)")
    user_overrides: list[str] = Field(default_factory=list, description="--set overrides, re-applied last")
    track: bool = Field(True, description="log MLflow runs")
    params: str | None = Field(None, description="the params file the config came from (for subprocess runs)")
    resume: bool = Field(False, description="continue an interrupted gspo experiment from its newest checkpoint; "
                         "a baselines experiment keeps the systems its results file holds")

    def run(self) -> list[ExperimentOutcome]:
        """One outcome per experiment run."""
        return run_experiments(self.cfg, RunRequest(only=self.only, limit=self.limit, results_dir=self.results_dir,
                                                    user_overrides=self.user_overrides, track=self.track,
                                                    params=self.params, resume=self.resume))


class ReportJob(Job):
    """``agent-gspo experiments report``: docs/results.md, its PNGs and the DVC metrics file, from results/ alone."""

    KIND = "experiments-report"
    results: str | None = Field(None, description="results folder (default experiments.results_dir)")
    out: str | None = Field(None, description="markdown report (default experiments.report)")
    metrics_file: str | None = Field(None, description="write accuracy and tokens per experiment here (DVC metrics)")

    def run(self) -> ReportOutput:
        """Claims and written paths."""
        study = study_section(self.cfg)
        # normalised (./results and results are one folder, and give one report, byte for byte)
        results = str(Path(_given(self.results, "--results") or study.results_dir))
        out = str(Path(_given(self.out, "--out") or study.report))
        # a mistyped folder would overwrite the report with NOT RUN everywhere
        if not Path(results).is_dir():
            what = "is not a folder" if Path(results).exists() else "results folder not found"
            raise UserError(f"{results}: {what} (run `agent-gspo experiments run` first, or pass --results "
                            "with the folder that holds the <experiment>.json files)")
        if not any(Path(results).glob("*.json")):
            raise UserError(f"{results}: no <experiment>.json results files in this folder (run `agent-gspo "
                            "experiments run` first, or pass --results with the folder that holds them)")
        # everything that can be refused is refused before the first PNG is written
        for path, what in ((out, "report (--out / experiments.report)"),
                           (self.metrics_file, "metrics file (--metrics)")):
            if path is not None:
                check_output_file(Path(path), what)
        metrics = experiments_metrics(load_results_dir(results)) if self.metrics_file else None  # loads = checks
        report = build_report(Path(results), Path(out), record=study.record,
                              command=f"agent-gspo experiments report --results {results} --out {out}")
        if metrics is not None:
            write_metrics(self.metrics_file, metrics)
        return report


def _given(value: str | None, option: str) -> str | None:
    """An option's value; an empty one is an error, not "use the default" (it would silently
    rewrite the committed report)."""
    if value is not None and not value.strip():
        raise UserError(f"{option}: empty path (omit the option for the default)")
    return value


def experiments_metrics(results: dict[str, ResultsFile]) -> dict[str, Any]:
    """Per experiment and evaluated system: macro accuracy, total and completion tokens."""
    keys = ("accuracy", "tokens_total", "tokens_completion")
    return {name: {system: {k: s[k] for k in keys if s.get(k) is not None} for system, s in res.summary.items()}
            for name, res in results.items()}
