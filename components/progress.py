"""One progress mechanism for every long step: throttled lines through :mod:`logging`.

Training (step, rollout call, decode token, update mini-batch), evaluation, search and data
preparation all report through :func:`report`. The lines go to the ``components.progress`` logger
at INFO, so the CLI shows them on stderr (:func:`log_to_stderr`) and a Prefect flow shows them in
its run logs (``flows/logs.py``) — the same lines, never a bar and a log line for one thing.

Reporters nest: a report opened while another is open (an evaluation batch's rollout, a decode
inside a training step's rollout) is written as part of its parent's line, and the whole tree
shares one throttle, so there is at most one line per ``interval_s`` whatever the depth::

    train 1/3 steps (step 2/3) > rollout 2/6 calls (4 episodes) > decode 17/32 tokens; 2 min 5 s elapsed,
    ~6 s left (decode), ~4 min left (train)

Each line names the counts, the time since the outermost report began and an estimate of time
left for the outermost and the next level (elapsed x undone / done, counting the open unit's part).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from components.errors import UserError

log = logging.getLogger("components.progress")

INTERVAL_S = 20.0
"""the most seconds between two lines while work advances (at least one line every 30 s)"""
INTERVAL_ENV = "AGENT_GSPO_PROGRESS_S"
"""overrides :data:`INTERVAL_S` (0: a line on every advance, e.g. in a test or a debugging session)"""


def _interval() -> float:
    text = os.environ.get(INTERVAL_ENV)
    if not text:
        return INTERVAL_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise UserError(f"${INTERVAL_ENV}={text!r}: expected seconds >= 0")
    return value

_current: contextvars.ContextVar[Progress | None] = contextvars.ContextVar("agent_gspo_progress", default=None)


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s" if s < 600 else f"{round(s / 60)} min"
    return f"{s // 3600} h {(s % 3600) // 60} min"


@dataclass(frozen=True)
class Pace:
    """How a tree of reports writes its lines (set on the root, inherited by nested reports): at
    most every ``interval_s`` seconds (None: ``$AGENT_GSPO_PROGRESS_S``, default 20) by ``clock``,
    to ``logger``. Tests inject a clock."""

    interval_s: float | None = None
    clock: Callable[[], float] = time.monotonic
    logger: logging.Logger = log


class Progress:
    """Counts of one piece of work (``done`` of ``total`` ``unit``), logged at most every
    ``interval_s`` seconds (see :class:`Pace`). Use :func:`report` to open one."""

    def __init__(self, what: str, total: int | None, unit: str, *, parent: Progress | None = None,
                 pace: Pace | None = None) -> None:
        self.what, self.total, self.unit, self.parent = what, total, unit, parent
        self.root: Progress = parent.root if parent is not None else self
        pace = pace or Pace()
        self.clock = self.root.clock if parent is not None else pace.clock
        self.interval_s: float = self.root.interval_s if parent is not None else (
            _interval() if pace.interval_s is None else pace.interval_s)
        self.logger = self.root.logger if parent is not None else pace.logger
        self.done = 0
        self.detail = ""
        self.child: Progress | None = None  # the newest report opened under this one
        if parent is not None:
            parent.child = self
        self.started = self.clock()
        self.last_line = self.started  # on the root: when the tree last wrote a line
        self.lines = 0

    @contextlib.contextmanager
    def active(self) -> Iterator[Progress]:
        """Make this the report that reports opened inside the block nest under (re-enterable)."""
        token = _current.set(self)
        try:
            yield self
        finally:
            _current.reset(token)

    def advance(self, n: int = 1, detail: str = "", *, shown: bool = False) -> None:
        """``n`` more units done (``detail``: what the count does not say, kept until replaced);
        write a line when the tree's last one is ``interval_s`` old. ``shown``: the caller has just
        printed its own line for this (a training step line), which restarts the interval."""
        self.done += n
        if detail:
            self.detail = detail
        now = self.clock()
        if shown:
            self.root.last_line = now
        elif now - self.root.last_line >= self.interval_s:
            self.root.last_line = now
            self.root.lines += 1
            self.logger.info(self.line(now))

    def _chain(self) -> list[Progress]:
        chain, p = [], self
        while p is not None:
            chain.append(p)
            p = p.parent
        return chain[::-1]

    def _count(self) -> str:
        of = f"/{self.total}" if self.total is not None else ""
        return f"{self.what} {self.done}{of} {self.unit}" + (f" ({self.detail})" if self.detail else "")

    def fraction(self) -> float | None:
        """Done so far, counting the open unit's part from the report below (None: no total)."""
        if not self.total:
            return None
        part = self.child.fraction() if self.child is not None and self.child.done < (self.child.total or 0) else 0.0
        return min(1.0, (self.done + (part or 0.0)) / self.total)

    def _left(self, now: float) -> str | None:
        f = self.fraction()
        if f is None or f <= 0.0 or f >= 1.0:
            return None
        return _duration((now - self.started) * (1.0 - f) / f)

    def line(self, now: float | None = None) -> str:
        now = self.clock() if now is None else now
        chain = self._chain()
        text = " > ".join(p._count() for p in chain) + f"; {_duration(now - self.root.started)} elapsed"
        inner = chain[1] if len(chain) > 1 else None
        lefts = [f"~{left} left ({p.what})" for p in (inner, self.root) if p is not None and (left := p._left(now))]
        return text + (", " + ", ".join(lefts) if lefts else "")


@contextlib.contextmanager
def report(what: str, total: int | None, unit: str, pace: Pace | None = None) -> Iterator[Progress]:
    """Open a :class:`Progress` under the one currently open (if any) for the ``with`` block
    (``pace``: only a root report's counts, see :class:`Pace`)."""
    with Progress(what, total, unit, parent=_current.get(), pace=pace).active() as progress:
        yield progress


def leaf(what: str, total: int | None, unit: str) -> Progress:
    """A :class:`Progress` under the one currently open, for a loop that opens nothing inside it
    (a decode's tokens): no ``with`` block, nothing to close."""
    return Progress(what, total, unit, parent=_current.get())


class StderrHandler(logging.StreamHandler):
    """A handler on whatever ``sys.stderr`` is when a record is written, not the one at setup: a
    caller that swaps stderr (a test's capture, a wrapper) and closes it later would otherwise get
    "--- Logging error ---" tracebacks from every later progress line."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def log_to_stderr() -> None:
    """Progress and messages of the library (``components.*`` loggers, INFO) on stderr, once per
    process (a caller may set up many times)."""
    logger = logging.getLogger("components")
    if not any(isinstance(h, StderrHandler) for h in logger.handlers):
        handler = StderrHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
