"""Shared test setup: offline-safety defaults before any test imports transformers/datasets/mlflow."""
import os
import signal
import sys
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT

import components  # noqa: F401  (applies components.env offline defaults on import)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (CI runs ``-n 2``) each worker computes with one torch thread: two workers of
    two threads each on a 2-core machine would oversubscribe it, and tiny-model work is dominated by
    per-op overhead anyway (see ``one_thread``). Subprocesses the tests start set their own threads."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


# Process-global settings a test may leave behind: ``mlflow.set_tracking_uri`` sets
# $MLFLOW_TRACKING_URI (which ``load_config`` honours); ``init_distributed`` fills the launcher's
# variables (MASTER_PORT: a port its process group may still hold). A subprocess a later test starts
# inherits them: under pytest-xdist a worker's earlier in-process test made a later `dvc repro`
# stage's rank bind that MASTER_PORT (EADDRINUSE).
_RESTORED_ENV = ("MLFLOW_TRACKING_URI", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _restore_process_env():
    """Restore the variables of ``_RESTORED_ENV`` after every test, so one test's tracking server or
    process group never leaks into the next test or the subprocesses it starts."""
    before = {name: os.environ.get(name) for name in _RESTORED_ENV}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_DEFAULT_HANDLERS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}


@pytest.fixture(autouse=True)
def _restore_signal_handlers(request: pytest.FixtureRequest):
    """Every test starts with Python's own SIGINT / SIGTERM handlers and leaves them so.

    A handler set to SIG_IGN is inherited by every process started afterwards (exec keeps an
    ignored signal ignored): in a CI run on two xdist workers, the four Ctrl-C tests that ran
    after some earlier test in the same worker saw `agent-gspo` ignore SIGINT (exit 0 or 1, not
    130). Which test leaves a handler changed is printed, so it can be fixed at its source."""
    for sig in _SIGNALS:
        if signal.getsignal(sig) is signal.SIG_IGN:
            signal.signal(sig, _DEFAULT_HANDLERS[sig])
    yield
    for sig in _SIGNALS:
        if signal.getsignal(sig) is not _DEFAULT_HANDLERS[sig]:
            print(f"\nconftest: {request.node.nodeid} left {signal.Signals(sig).name} handled by "
                  f"{signal.getsignal(sig)!r}; restored", file=sys.stderr)
            signal.signal(sig, _DEFAULT_HANDLERS[sig])


ROOT = REPO_ROOT
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
