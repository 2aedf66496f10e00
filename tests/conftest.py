"""Shared test setup: offline-safety defaults before any test imports transformers/datasets/mlflow."""

import os
from pathlib import Path

import pytest

import components  # noqa: F401  (applies components.env offline defaults on import)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (CI runs ``-n 2``) each worker computes with one torch thread: two workers of
    two threads each on a 2-core machine would oversubscribe it, and tiny-model work is dominated by
    per-op overhead anyway (see ``one_thread``). Subprocesses the tests start set their own threads."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _restore_mlflow_tracking_uri():
    """``mlflow.set_tracking_uri`` also sets ``$MLFLOW_TRACKING_URI``, which ``load_config`` honours:
    restore it after every test so one test's tracking server never leaks into the next."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before


ROOT = Path(__file__).resolve().parents[1]
MIRROR = Path(os.environ.get("AGENT_GSPO_DATA_MIRROR", ROOT.parent / "shared" / "benchmarks"))


@pytest.fixture(scope="session")
def prepared_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All benchmarks (the seven and the generated splitinfo) prepared once per test session (seconds)."""
    from components.config import ALL_BENCHMARKS
    from components.data.prepare import prepare

    if not (MIRROR / "gsm8k").is_dir():
        pytest.skip(f"benchmark mirror not found at {MIRROR} (set AGENT_GSPO_DATA_MIRROR)")
    out = tmp_path_factory.mktemp("data")
    prepare(list(ALL_BENCHMARKS), mirror=MIRROR, out_dir=out, progress=False)
    return out


@pytest.fixture
def one_thread():
    """Tiny-model work is dominated by per-op overhead: one torch thread is faster on 2 cores."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
