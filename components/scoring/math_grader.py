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
import bisect
import itertools
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from components.scoring.result import ScoreResult, last_boxed

_ANSWER_RE = re.compile(r"(?:final\s+answer|answer)\s*(?:is|:|=)\s*:?\s*", re.I)
_SPAN_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
"""(open, close) of a math span, in the order tried at one position"""
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
        span = next(math_spans(tail), None)
        if span is not None:
            return span.strip()
        tail = re.split(r"\.(?:\s|$)", tail, maxsplit=1)[0].strip().rstrip(".")
        if tail:
            return tail
    spans = list(math_spans(text))
    if spans:
        return spans[-1].strip()
    numbers = _NUMBER_RE.findall(text)
    return numbers[-1] if numbers else None


def math_spans(text: str) -> Iterator[str]:
    r"""Contents of the math spans of ``text``, left to right: what ``re.finditer`` of
    ``\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]`` (re.S) finds, in linear time.

    Hand-written because that regex is quadratic on unclosed openers (each ``\(`` scans to the end
    of the text: 100 000 of them took 2 minutes, in C, where neither a timeout nor SIGTERM acts).
    Here each opener looks up its closer among precomputed positions (bisect), O(n log n) in all.
    """
    closers = {close: [m.start() for m in re.finditer(f"(?={re.escape(close)})", text)]  # overlapping: "$$$"
               for _, close in _SPAN_DELIMITERS}
    pos = 0
    while pos < len(text):
        for opener, close in _SPAN_DELIMITERS:
            if not text.startswith(opener, pos):
                continue
            start = pos + len(opener)
            ends = closers[close]
            k = bisect.bisect_left(ends, start + 1)  # `.+?`: at least one character inside
            if k < len(ends):
                yield text[start:ends[k]]
                pos = ends[k] + len(close)
                break
        else:
            pos += 1


def normalise_latex(text: str) -> str:
    r"""Whitespace, ``\left``/``\right``, ``\!``/``\,``, ``\dfrac``/``\tfrac`` and ``$`` removed."""
    text = re.sub(r"\\(?:left|right)\b|\\[!,;: ]|\$", "", text)
    text = re.sub(r"\\[dt]frac", r"\\frac", text)
    return re.sub(r"\s+", "", text)


def _verify(extracted: str, gold: str, timeout_s: int) -> tuple[bool, str | None]:
    """Runs in a worker process's main thread (so math-verify's signal timeouts work).

    math-verify answers False when one of its own timeouts fires (``raise_on_error=False``), so a
    correct answer too costly to check (``\\frac{14}{3} + 0\\cdot 9^{9^{9^{9}}}``) would pass for a
    wrong one. So both calls run with ``raise_on_error=True``: its timeout is then the only
    ``TimeoutException`` (a ``BaseException``), which becomes a grader error, while any other
    exception is caught here and means what math-verify itself makes of it (no parse: ``[]``; a
    failed comparison: False). ``verify`` is called per (gold, prediction) pair, as it loops
    internally, so a timeout on one pair still lets another prove the answer correct.
    """
    from math_verify import parse, verify
    from math_verify.errors import TimeoutException

    if normalise_latex(extracted) == normalise_latex(gold):
        return True, None
    try:
        gold_parsed = _parse(parse, gold, timeout_s)
    except TimeoutException:
        return False, f"grader: math-verify timed out ({timeout_s}s) parsing the gold answer {gold!r:.200}"
    try:
        pred_parsed = _parse(parse, extracted, timeout_s)
    except TimeoutException:
        return False, f"grader: math-verify timed out ({timeout_s}s) parsing the answer"
    if len(gold_parsed) < 2:  # [sympy object, string] on success; only the string on failure
        return False, f"grader: math-verify could not parse the gold answer {gold!r}"
    if not pred_parsed:
        return False, None  # an unparseable prediction is simply wrong
    timed_out = False
    for g, t in itertools.product(gold_parsed, pred_parsed):
        try:
            if verify(g, t, timeout_seconds=timeout_s, raise_on_error=True):
                return True, None
        except TimeoutException:
            timed_out = True
        except Exception:  # noqa: BLE001 - math-verify's own reading of a failed comparison: not equal
            continue
    if timed_out:
        return False, f"grader: math-verify timed out ({timeout_s}s) comparing the answers"
    return False, None


def _parse(parse: Any, latex: str, timeout_s: int) -> list[Any]:
    """``math_verify.parse`` of ``\\boxed{latex}``; a ``TimeoutException`` propagates, any other
    failure is ``[]`` as with ``raise_on_error=False``."""
    try:
        return parse("\\boxed{" + latex + "}", parsing_timeout=timeout_s, raise_on_error=True)
    except Exception:  # noqa: BLE001 - what math-verify returns for an unparseable text
        return []


_WORKER_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from components.scoring.math_grader import _serve; _serve(int(sys.argv[2]), int(sys.argv[3]))"
)


def _serve(read_fd: int, write_fd: int) -> None:
    """Entry point of a worker process: answer tasks from the parent until EOF."""
    _worker_main_io(Connection(read_fd, writable=False), Connection(write_fd, readable=False))


def _worker_main_io(inbox: Connection, outbox: Connection) -> None:
    """Answer ``(request id, extracted, gold, timeout)`` with ``(request id, status, payload)``."""
    while True:
        try:
            task = inbox.recv()
        except EOFError:
            return
        if task is None:
            return
        req_id, extracted, gold, timeout_s = task
        try:
            outbox.send((req_id, "ok", _verify(extracted, gold, timeout_s)))
        except BaseException as exc:  # report, never die silently
            outbox.send((req_id, "error", f"{type(exc).__name__}: {exc}"[:300]))


class _Dead(Exception):
    """The worker cannot be used any more (it died, hung, or answered out of turn)."""


class _Worker:
    """One grader process, started with ``subprocess`` (not ``multiprocessing.spawn``, which
    re-imports the caller's ``__main__`` and fails in scripts without a main guard).

    Every request carries an id and every reply must echo it: a reply to an earlier request (a
    warm-up answered late, an item that timed out) is dropped, never taken for this one's."""

    def __init__(self, boot: str = _WORKER_BOOT) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        root = str(Path(__file__).resolve().parents[2])
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", boot, root, str(to_child_r), str(from_child_w)],
                pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self.outbox = Connection(to_child_w, readable=False)
        self.inbox = Connection(from_child_r, writable=False)
        self._ids = itertools.count(1)

    def ask(self, extracted: str, gold: str, inner_timeout: int, wait_s: float) -> tuple[str, Any]:
        """Send one request and wait up to ``wait_s`` for its own reply; :class:`_Dead` otherwise."""
        req_id = next(self._ids)
        deadline = time.monotonic() + wait_s
        try:
            self.outbox.send((req_id, extracted, gold, inner_timeout))
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not self.inbox.poll(left):
                    raise _Dead(f"no answer within {wait_s:g}s")
                reply = self.inbox.recv()
                if not (isinstance(reply, tuple) and len(reply) == 3 and isinstance(reply[0], int)):
                    raise _Dead(f"malformed reply {reply!r:.80}")
                if reply[0] == req_id:
                    return reply[1], reply[2]
                if reply[0] > req_id:
                    raise _Dead(f"reply to request {reply[0]} while waiting for {req_id}")
                # an older request's late answer: drop it
        except (EOFError, OSError) as exc:
            raise _Dead(f"worker died ({type(exc).__name__})") from None

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        for conn in (self.outbox, self.inbox):
            try:
                conn.close()
            except OSError:
                pass


class MathGraderPool:
    """A bounded set of long-lived math-verify processes with a per-item wall-clock deadline.

    Thread-safe: ``grade`` blocks until a worker is free, so at most ``max_workers`` items are
    graded at once however many threads call it. A worker that dies, hangs or fails its warm-up
    is killed and its slot freed (waiting threads are woken to start a replacement), so ``grade``
    always returns: a verdict for exactly its own item, or ``(False, "grader: ...")``.
    ``worker_boot`` replaces the worker's ``python -c`` code (tests inject faults with it).
    """

    def __init__(self, max_workers: int | None = None, startup_timeout_s: float = 120.0, *,
                 worker_boot: str | None = None) -> None:
        self.max_workers = max(1, min(max_workers or 2, os.cpu_count() or 1))
        self.startup_timeout_s = startup_timeout_s
        self._boot = worker_boot or _WORKER_BOOT
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._cond = threading.Condition()
        self._created = 0
        self._closed = False

    def _acquire(self) -> _Worker | None:
        """An idle worker, or None when the caller may start one (its slot is then counted)."""
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("MathGraderPool is closed")
                if not self._idle.empty():
                    return self._idle.get_nowait()
                if self._created < self.max_workers:
                    self._created += 1
                    return None
                self._cond.wait()

    def _release(self, worker: _Worker) -> None:
        with self._cond:
            self._idle.put(worker)
            self._cond.notify()

    def _discard(self, worker: _Worker | None) -> None:
        """Kill ``worker`` (if any) and free its slot."""
        if worker is not None:
            worker.kill()
        with self._cond:
            self._created -= 1
            self._cond.notify()

    def _start(self) -> _Worker:
        """A new worker that has imported math-verify (spawn + sympy import take seconds)."""
        worker = _Worker(self._boot)
        try:
            worker.ask("1", "1", 5, self.startup_timeout_s)
        except _Dead as exc:
            worker.kill()
            raise _Dead(f"start-up failed: {exc}") from None
        return worker

    def grade(self, extracted: str, gold: str, timeout_s: float = 10.0) -> tuple[bool, str | None]:
        """(correct, error) for one extracted answer; error starts with "grader:" on failure."""
        worker = self._acquire()
        if worker is None:
            try:
                worker = self._start()
            except (_Dead, OSError) as exc:
                self._discard(None)
                return False, f"grader: math-verify worker {exc}"
        inner = max(1, int(timeout_s) - 1)
        try:
            status, payload = worker.ask(extracted, gold, inner, timeout_s)
        except _Dead as exc:
            self._discard(worker)
            if str(exc).startswith("no answer"):
                return False, f"grader: math-verify exceeded {timeout_s:g}s wall-clock"
            return False, f"grader: math-verify {exc}"
        except BaseException:
            self._discard(worker)
            raise
        self._release(worker)
        if status == "error":
            return False, f"grader: {payload}"
        return payload

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            idle = []
            while not self._idle.empty():
                idle.append(self._idle.get_nowait())
        for worker in idle:
            try:
                worker.outbox.send(None)
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
