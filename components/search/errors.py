"""Errors of the search package: all are :class:`UserError` (the CLI exits 2 with the message)."""

from __future__ import annotations

from components.errors import UserError


class SearchError(UserError):
    """Bad search input: storage URL, budget, params file or a trial function's outcome."""
