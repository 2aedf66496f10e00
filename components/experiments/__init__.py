"""Results reproduction: the paper's token-economy experiments at small scale, and their report.

``agent-gspo experiments run`` trains / evaluates each experiment declared in
``params.yaml -> experiments.definitions`` (:func:`run_experiments`) and writes one
``results/<name>.json`` each (:mod:`.results`); ``agent-gspo experiments report`` turns that folder
into ``docs/results.md`` + PNGs (:func:`build_report`, a pure function of the folder) with a
Claims section computed from the numbers (:mod:`.claims`).
"""

from components.experiments.claims import Claim, all_claims
from components.experiments.definitions import (
    Experiment,
    ExperimentError,
    budget_from_calibration,
    experiment_config,
    resolve,
    select,
)
from components.experiments.report import ReportOutput, build_report
from components.experiments.results import (
    SCHEMA_VERSION,
    BudgetInfo,
    EvalCell,
    ResultsFile,
    ResultsFileError,
    load_results,
    load_results_dir,
    write_results,
)
from components.experiments.runner import ExperimentOutcome, run_experiments, run_one

__all__ = ["SCHEMA_VERSION", "BudgetInfo", "Claim", "EvalCell", "Experiment", "ExperimentError", "ExperimentOutcome",
           "ReportOutput", "ResultsFile", "ResultsFileError", "all_claims", "budget_from_calibration", "build_report",
           "experiment_config", "load_results", "load_results_dir", "resolve", "run_experiments", "run_one", "select",
           "write_results"]
