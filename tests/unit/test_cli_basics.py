"""The CLI entry point as a library caller sees it (main() called many times in one process)."""

from __future__ import annotations


def test_progress_lines_follow_the_current_stderr_and_main_adds_one_handler(monkeypatch, capsys) -> None:
    """main() in one process many times (tests, notebooks, wrappers): it added a handler on the stderr of
    the moment each time, and once that stream was closed every progress line printed a logging traceback."""
    import io
    import logging

    from components.cli import _log_progress
    from components.progress import StderrHandler as _StderrHandler

    first = io.StringIO()
    monkeypatch.setattr("sys.stderr", first)
    _log_progress("train")
    first.close()
    second = io.StringIO()
    monkeypatch.setattr("sys.stderr", second)
    _log_progress("evaluate")
    logging.getLogger("components.test").info("batch 1/2 done")
    logger = logging.getLogger("components")
    assert sum(isinstance(h, _StderrHandler) for h in logger.handlers) == 1
    assert "batch 1/2 done" in second.getvalue() and "Logging error" not in second.getvalue()
