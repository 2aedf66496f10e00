r"""Math answers (MATH-500): extract the final answer, check equivalence with math-verify.

Extraction (``extract_math_answer``): the last ``\boxed{...}``, else the text after the last
"answer is" / "final answer:" (up to the end of the sentence), else the last math span
(``$...$``, ``\(...\)``, ``\[...\]``), else the last number. Equivalence: math-verify's
``verify(parse(gold), parse(pred))`` (handles ``\frac{1}{2}`` = 0.5 = ``\dfrac12``, intervals,
tuples, sets, ``\$`` and degree signs, symbolic equality), plus an exact match of the
whitespace/``\left``/``\right``-normalised strings for answers math-verify cannot parse
(e.g. ``\text{(C)}``).

Why a process pool of our own: math-verify's timeouts use ``signal.alarm``, which works only
in a process's main thread (in worker threads it raises, or with timeouts disabled a sympy
call can hang forever; elsewhere that silently scored everything 0). Each worker here is a
separate process whose main thread runs math-verify with its own timeouts, and the parent
enforces a wall-clock deadline per item by polling the pipe: a hung or crashed worker is
killed and replaced, and the item gets ``ScoreResult(False, extracted, "grader: ...")``.
``concurrent.futures.ProcessPoolExecutor`` cannot kill one stuck task, hence this small pool.
"""

from __future__ import annotations

import atexit
import os
import queue
import re
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from components.scoring.result import ScoreResult, last_boxed

_ANSWER_RE = re.compile(r"(?:final\s+answer|answer)\s*(?:is|:|=)\s*:?\s*", re.I)
_SPAN_RE = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.S)
_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


def extract_math_answer(prediction: str) -> str | None:
    """The final-answer LaTeX string of a free-text solution, or None (see module docstring)."""
    text = prediction or ""
    boxed = last_boxed(text)
    if boxed is not None and boxed.strip():
        return boxed.strip()
    matches = list(_ANSWER_RE.finditer(text))
    if matches:
        tail = text[matches[-1].end() :].split("\n", 1)[0]
        span = _SPAN_RE.search(tail)
        if span:
            return next(g for g in span.groups() if g is not None).strip()
        tail = re.split(r"\.(?:\s|$)", tail, maxsplit=1)[0].strip().rstrip(".")
        if tail:
            return tail
    spans = list(_SPAN_RE.finditer(text))
    if spans:
        return next(g for g in spans[-1].groups() if g is not None).strip()
    numbers = _NUMBER_RE.findall(text)
    return numbers[-1] if numbers else None


def normalise_latex(text: str) -> str:
    r"""Whitespace, ``\left``/``\right``, ``\!``/``\,``, ``\dfrac``/``\tfrac`` and ``$`` removed."""
    text = re.sub(r"\\(?:left|right)\b|\\[!,;: ]|\$", "", text)
    text = re.sub(r"\\[dt]frac", r"\\frac", text)
    return re.sub(r"\s+", "", text)


def _verify(extracted: str, gold: str, timeout_s: int) -> tuple[bool, str | None]:
    """Runs in a worker process's main thread (so math-verify's signal timeouts work)."""
    from math_verify import parse, verify

    if normalise_latex(extracted) == normalise_latex(gold):
        return True, None
    gold_parsed = parse("\\boxed{" + gold + "}", parsing_timeout=timeout_s, raise_on_error=False)
    pred_parsed = parse("\\boxed{" + extracted + "}", parsing_timeout=timeout_s, raise_on_error=False)
    if len(gold_parsed) < 2:  # [sympy object, string] on success; only the string on failure
        return False, f"grader: math-verify could not parse the gold answer {gold!r}"
    if not pred_parsed:
        return False, None  # an unparseable prediction is simply wrong
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout_s)), None


_WORKER_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from components.scoring.math_grader import _serve; _serve(int(sys.argv[2]), int(sys.argv[3]))"
)


def _serve(read_fd: int, write_fd: int) -> None:
    """Entry point of a worker process: answer tasks from the parent until EOF."""
    _worker_main_io(Connection(read_fd, writable=False), Connection(write_fd, readable=False))


def _worker_main_io(inbox: Connection, outbox: Connection) -> None:
    while True:
        try:
            task = inbox.recv()
        except EOFError:
            return
        if task is None:
            return
        extracted, gold, timeout_s = task
        try:
            outbox.send(("ok", _verify(extracted, gold, timeout_s)))
        except BaseException as exc:  # report, never die silently
            outbox.send(("error", f"{type(exc).__name__}: {exc}"[:300]))


class _Worker:
    """One grader process, started with ``subprocess`` (not ``multiprocessing.spawn``, which
    re-imports the caller's ``__main__`` and fails in scripts without a main guard)."""

    def __init__(self) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        root = str(Path(__file__).resolve().parents[2])
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_BOOT, root, str(to_child_r), str(from_child_w)],
            pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        self.outbox = Connection(to_child_w, readable=False)
        self.inbox = Connection(from_child_r, writable=False)

    def send(self, obj: Any) -> None:
        self.outbox.send(obj)

    def poll(self, timeout_s: float) -> bool:
        return self.inbox.poll(timeout_s)

    def recv(self) -> Any:
        return self.inbox.recv()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(5)
        self.outbox.close()
        self.inbox.close()


class MathGraderPool:
    """A bounded set of long-lived math-verify processes with a per-item wall-clock deadline.

    Thread-safe: ``grade`` blocks until a worker is free, so at most ``max_workers`` items are
    graded at once however many threads call it.
    """

    def __init__(self, max_workers: int | None = None, startup_timeout_s: float = 120.0) -> None:
        self.max_workers = max(1, min(max_workers or 2, os.cpu_count() or 1))
        self.startup_timeout_s = startup_timeout_s
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._lock = threading.Lock()
        self._created = 0
        self._closed = False

    def _acquire(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise RuntimeError("MathGraderPool is closed")
            spawn = self._idle.empty() and self._created < self.max_workers
            if spawn:
                self._created += 1
        return self._warm(_Worker()) if spawn else self._idle.get()

    def _warm(self, worker: _Worker) -> _Worker:
        """Import math-verify before the first timed item (spawn + sympy import take seconds)."""
        worker.send(("1", "1", 5))
        if worker.poll(self.startup_timeout_s):
            worker.recv()
        return worker

    def grade(self, extracted: str, gold: str, timeout_s: float = 10.0) -> tuple[bool, str | None]:
        """(correct, error) for one extracted answer; error starts with "grader:" on failure."""
        worker = self._acquire()
        inner = max(1, int(timeout_s) - 1)
        try:
            worker.send((extracted, gold, inner))
            if not worker.poll(timeout_s):
                raise TimeoutError(f"grader: math-verify exceeded {timeout_s:g}s wall-clock")
            status, payload = worker.recv()
        except TimeoutError as exc:
            self._replace(worker)
            return False, str(exc)
        except (EOFError, OSError) as exc:
            self._replace(worker)
            return False, f"grader: math-verify worker died ({type(exc).__name__})"
        self._idle.put(worker)
        if status == "error":
            return False, f"grader: {payload}"
        return payload

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._created -= 1

    def close(self) -> None:
        with self._lock:
            self._closed = True
        while not self._idle.empty():
            worker = self._idle.get_nowait()
            try:
                worker.send(None)
            except OSError:
                pass
            worker.kill()


_POOL: MathGraderPool | None = None
_POOL_LOCK = threading.Lock()


def get_pool(max_workers: int | None = None) -> MathGraderPool:
    """The process-wide pool (created on first use, closed at interpreter exit)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL._closed:
            _POOL = MathGraderPool(max_workers)
            atexit.register(_POOL.close)
        return _POOL


def score_math(prediction: str, gold: str, *, timeout_s: float = 10.0,
               pool: MathGraderPool | None = None) -> ScoreResult:
    """Score a free-text math solution against a gold LaTeX answer."""
    extracted = extract_math_answer(prediction)
    if extracted is None:
        return ScoreResult(False, None, None)
    correct, error = (pool or get_pool()).grade(extracted, str(gold).strip(), timeout_s)
    return ScoreResult(bool(correct), extracted, error)
