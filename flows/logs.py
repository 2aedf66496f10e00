"""Library progress lines (``components.*`` loggers) in the Prefect run logs and the terminal.

The library logs with :mod:`logging` and knows nothing of Prefect; inside a task,
:func:`forward_logs` attaches a handler that re-emits those records on the task's run logger, so
they show in the Prefect UI and in the worker's terminal (Prefect's console handler) alike.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from prefect import get_run_logger


class _ToRunLogger(logging.Handler):
    def __init__(self, target: logging.LoggerAdapter) -> None:
        super().__init__(logging.INFO)
        self.target = target

    def emit(self, record: logging.LogRecord) -> None:
        self.target.log(record.levelno, record.getMessage())


@contextlib.contextmanager
def forward_logs(name: str = "components") -> Iterator[logging.LoggerAdapter]:
    """Within the block, INFO+ records of logger ``name`` go to the current run's logger (yielded)."""
    run_logger = get_run_logger()
    source = logging.getLogger(name)
    handler = _ToRunLogger(run_logger)
    level, propagate = source.level, source.propagate
    source.addHandler(handler)
    source.propagate = False  # the run logger prints them already; a root console handler would repeat them
    if source.getEffectiveLevel() > logging.INFO:
        source.setLevel(logging.INFO)
    try:
        yield run_logger
    finally:
        source.removeHandler(handler)
        source.setLevel(level)
        source.propagate = propagate
