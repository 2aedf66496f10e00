"""The math-verify pool under injected faults: slow start-ups, workers that die or hang while
warming up or grading. ``grade`` must always return, and a verdict without an error is always the
verdict of *its own* item (never another item's, as when a late warm-up reply was taken for the
first real answer)."""

import threading
import time
from pathlib import Path

import pytest

from components.scoring.math_grader import MathGraderPool

# Each worker process numbers itself (files in a folder, under a lock: two workers starting together
# must not both take the same number), then applies ACTION (which may use n, the
# number of workers started before it), and serves with a stand-in for math-verify (string
# equality, so a worker starts in ~0.1 s): verdicts are then known exactly.
BOOT = (
    "import fcntl, os, sys, time; sys.path.insert(0, sys.argv[1]); d = {folder!r}; "
    "lk = open(d + '.lock', 'a'); fcntl.flock(lk, fcntl.LOCK_EX); n = len(os.listdir(d)); "
    "open(os.path.join(d, str(n)), 'w').close(); fcntl.flock(lk, fcntl.LOCK_UN); {action}; "
    "import components.scoring.math_grader as m; "
    "m._verify = lambda e, g, t: (time.sleep(3600) if e == 'hang' else None, (e == g, None))[1]; "
    "m._serve(int(sys.argv[2]), int(sys.argv[3]))"
)
CASES = [("2", "3", False), ("5", "5", True), ("7", "8", False), ("9", "9", True)]


def _pool(tmp_path: Path, action: str, **kw: float) -> MathGraderPool:
    folder = tmp_path / "workers"
    folder.mkdir(exist_ok=True)
    return MathGraderPool(worker_boot=BOOT.format(folder=str(folder), action=action), **kw)  # type: ignore[arg-type]


def _started(tmp_path: Path) -> int:
    return len(list((tmp_path / "workers").iterdir()))


def _check(results: list[tuple[bool, str | None]], cases: list[tuple[str, str, bool]]) -> int:
    """Every verdict without an error is the right one; returns how many came without an error."""
    for (ok, err), (e, g, truth) in zip(results, cases, strict=True):
        assert err is not None or ok == truth, f"grade({e!r}, {g!r}) = {ok} (another item's verdict?)"
        assert err is None or (err.startswith("grader:") and not ok)
    return sum(err is None for _, err in results)


def test_late_warm_up_reply_is_never_taken_for_an_answer(tmp_path: Path) -> None:
    """The first worker answers its warm-up after the start-up timeout (the off-by-one of old)."""
    pool = _pool(tmp_path, "time.sleep(8.0) if n == 0 else None", max_workers=1, startup_timeout_s=4.0)
    try:
        cases = CASES * 2
        results = [pool.grade(e, g, timeout_s=5) for e, g, _ in cases]
        assert _check(results, cases) >= len(cases) - 1  # only the slow worker's item may fail
        assert results[0][1] is not None and "start-up" in results[0][1]
    finally:
        pool.close()


def test_worker_answering_late_during_grading_is_replaced(tmp_path: Path) -> None:
    pool = _pool(tmp_path, "None", max_workers=1, startup_timeout_s=5.0)
    try:
        ok, err = pool.grade("hang", "hang", timeout_s=1.0)
        assert not ok and err and "exceeded" in err
        cases = CASES
        assert _check([pool.grade(e, g, timeout_s=5) for e, g, _ in cases], cases) == len(cases)
        assert _started(tmp_path) == 2
    finally:
        pool.close()


def test_workers_dying_in_warm_up_never_leak_a_slot(tmp_path: Path) -> None:
    """More deaths than slots: the pool keeps answering (it used to block forever)."""
    pool = _pool(tmp_path, "os._exit(3) if n < 5 else None", max_workers=2, startup_timeout_s=5.0)
    try:
        results: list = [None] * 12
        cases = (CASES * 3)[:12]

        def job(k: int) -> None:
            results[k] = pool.grade(cases[k][0], cases[k][1], timeout_s=5)

        threads = [threading.Thread(target=job, args=(k,)) for k in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads), "grade blocked"
        assert _check(results, cases) >= 12 - 5
        assert sum("died" in (err or "") or "start-up" in (err or "") for _, err in results) == 5
        assert pool._created <= pool.max_workers
    finally:
        pool.close()


def test_worker_hanging_in_warm_up_is_killed(tmp_path: Path) -> None:
    pool = _pool(tmp_path, "time.sleep(3600) if n == 0 else None", max_workers=1, startup_timeout_s=4.0)
    try:
        t0 = time.monotonic()
        ok, err = pool.grade("1", "1", timeout_s=5)
        assert not ok and err and "start-up" in err and time.monotonic() - t0 < 15
        assert pool.grade("4", "4", timeout_s=5) == (True, None)
        assert pool.grade("4", "5", timeout_s=5) == (False, None)
    finally:
        pool.close()


@pytest.mark.parametrize("threads", [1, 4])
def test_concurrent_items_get_their_own_verdicts(tmp_path: Path, threads: int) -> None:
    pool = _pool(tmp_path, "time.sleep(0.3 * (n % 2))", max_workers=2, startup_timeout_s=5.0)
    try:
        cases = [(str(k), str(k if k % 3 else k + 1), k % 3 != 0) for k in range(40)]
        results: list = [None] * len(cases)
        lock = threading.Lock()
        queue = list(range(len(cases)))

        def job() -> None:
            while True:
                with lock:
                    if not queue:
                        return
                    k = queue.pop()
                results[k] = pool.grade(cases[k][0], cases[k][1], timeout_s=5)

        workers = [threading.Thread(target=job) for _ in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join(timeout=120)
        assert _check(results, cases) == len(cases)
    finally:
        pool.close()
