"""The project's own modules are imported at module level (issue 50), so the dependency graph is
what `lint-imports` reads: an import hidden in a function body escapes the layer contract.

A function-local import of ``components``/``flows`` (or a relative one) fails here unless it is
listed below with its reason. The only reasons admitted are a heavy third party (torch,
transformers, mlflow, great-expectations, optuna, scipy, Prefect) that a command which does not
need it would otherwise load, and the CLI entry point, whose dispatch is lazy by design (its
docstring). ``PENDING`` names whole files that other helpers are restructuring in parallel (the
gspo/runtime split, the experiments move, mas/scoring); the lead shrinks it after merging.
"""

from __future__ import annotations

import ast
import subprocess
import sys

from helpers.paths import REPO_ROOT

ROOT = REPO_ROOT
PACKAGES = ("components", "flows", "experiments")

ALLOWED: dict[tuple[str, str], str] = {
    ("components/cli.py", "components.data.prepare"): "entry point: `score` only; pyarrow kept out of --help",
    ("components/cli.py", "components.evaluation.items"): "entry point: `score --items` only; scipy (~2.4 s)",
    ("components/cli.py", "components.scoring"): "entry point: `score` only; the graders load multiprocessing",
    ("components/cli.py", "components.scoring.sandbox"): "entry point: `score` only, as above",
    ("components/cli.py", "components.search"): "entry point: `train --best-params` only; optuna (~3 s)",
    ("components/cli.py", "flows.local_server"): "entry point: `run` only; it opens libc with ctypes at import",
    ("components/cli.py", "flows.pipeline"): "entry point: `run` only; Prefect and torch",
    ("components/jobs/train.py", "components.runtime.training_run"): "torch: a launcher's parent (torchrun, "
                                                                       "deepspeed) never loads it",
    ("components/jobs/train.py", "components.runtime.checkpoint"): "torch, as above (only after a failed launch)",
    ("components/jobs/train.py", "components.tracking.lineage"): "mlflow, only when the training is tracked",
    ("components/mas/environment.py", "components.scoring.grader"): "math-verify and the sandbox: a rollout "
                                                                      "without grading never loads them",
    ("components/runtime/training_run.py", "components.runtime.run_tracking"): "mlflow: a training without "
                                                                                 "tracking never loads it",
    ("components/config_sections.py", "components.comparison"): "scipy (~2.4 s) would load with every config",
    ("components/data/prepare.py", "components.data.expectations"): "great-expectations (~4 s): score/evaluate "
                                                                     "read prepared data without it",
    ("components/evaluation/items.py", "components.tracking.backend"): "mlflow, only when an evaluation is tracked",
    ("components/evaluation/runner.py", "components.tracking"): "mlflow, only for a models:/ or runs:/ URI",
    ("components/evaluation/setting.py", "components.models.loading"): "torch: `promote` plans a setting "
                                                                         "without loading a model",
    ("components/jobs/promote.py", "components.jobs.evaluate"): "torch: only --evaluate-champion evaluates",
    ("components/models/loading.py", "components.models.tiny"): "transformers (the tiny model is built on use); "
                                                                 "test_models_loading swaps the module",
    ("components/search/tracking.py", "components.tracking"): "mlflow: a search without a tracker never loads it",
    ("components/search/tracking.py", "components.tracking.backend"): "mlflow, as above",
    ("components/tracking/served.py", "components.mas.engine"): "torch: the recorded settings are read "
                                                                 "(promote) without a model",
    ("components/tracking/served.py", "components.models"): "torch, as above",
}

PENDING: dict[str, str] = {}


def _own(module: str) -> bool:
    return module.startswith(".") or module.split(".")[0] in PACKAGES


def local_imports() -> list[tuple[str, int, str]]:
    """``(file, line, module)`` of every import of the project's own modules inside a function body."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                for sub in ast.walk(node):
                    if isinstance(sub, ast.ImportFrom):
                        modules = ["." * sub.level + (sub.module or "")]
                    elif isinstance(sub, ast.Import):
                        modules = [alias.name for alias in sub.names]
                    else:
                        continue
                    found += [(rel, sub.lineno, m) for m in modules if _own(m)]
    return sorted(set(found))


def test_project_imports_are_at_module_level() -> None:
    bad = [f"{f}:{line}: {m}" for f, line, m in local_imports() if (f, m) not in ALLOWED and f not in PENDING]
    assert not bad, ("imports of the project's own modules inside functions (move them to module level, or "
                     "allowlist one with its reason in this test):\n" + "\n".join(bad))


def test_allowlist_is_not_stale() -> None:
    seen = {(f, m) for f, _, m in local_imports()}
    stale = sorted(set(ALLOWED) - seen)
    assert not stale, f"allowlisted imports no longer function-local (drop them from ALLOWED): {stale}"
    gone = sorted(f for f in PENDING if not (ROOT / f).exists() or f not in {f for f, _ in seen})
    assert not gone, f"PENDING files that are gone or clean now (drop them from PENDING): {gone}"


def test_cli_help_loads_no_heavy_package() -> None:
    """The reason for the entry point's lazy dispatch: ``agent-gspo --help`` / ``config keys`` stay light."""
    heavy = ("torch", "transformers", "mlflow", "prefect", "optuna", "scipy", "great_expectations", "pyarrow")
    code = ("import sys, components.cli; "
            f"print(' '.join(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"importing components.cli loads {out.stdout.strip()}"
