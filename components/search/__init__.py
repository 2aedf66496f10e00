"""Budget-constrained hyper-parameter search with Optuna 5 (see :mod:`components.search.study`)."""

from components.search.budget import Budget, Ledger
from components.search.errors import SearchError
from components.search.params_file import load_best_params, write_best_params
from components.search.space import (
    DEFAULT_SPACE,
    CategoricalParam,
    FloatParam,
    IntParam,
    SearchSpace,
    SearchSpaceError,
    TiedParam,
    apply_overrides,
    suggest,
)
from components.search.study import SearchResult, TrialOutcome, Worker, run_search, select_best
from components.search.tracking import mlflow_tracker_factory

__all__ = [
    "DEFAULT_SPACE", "Budget", "CategoricalParam", "FloatParam", "IntParam", "Ledger", "SearchError",
    "SearchResult", "SearchSpace", "SearchSpaceError", "TiedParam", "TrialOutcome", "Worker", "apply_overrides",
    "load_best_params", "mlflow_tracker_factory", "run_search", "select_best", "suggest", "write_best_params",
]
