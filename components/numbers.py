"""The checks of "a finite number": :func:`is_finite_number` for values read from files (metrics,
results summaries), :func:`finite_float` for a setting a constructor is given (the budget
controller's gains, the reward's lambda_tok).

A bool is an ``int`` to Python but not a number to a reader of ``metrics.json``: ``true`` is
refused, like NaN and ±inf (JSON cannot even write them portably)."""

from __future__ import annotations

import math
from typing import Any


def is_finite_number(value: Any) -> bool:
    """True for an int or float (not a bool) that is neither NaN nor infinite."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def finite_float(value: object, what: str, error: type[Exception]) -> float:
    """``value`` as a float; ``error("<what> must be a number (got ...)")`` when it is none, and
    ``error("<what> must be finite (got ...)")`` for NaN or ±inf."""
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise error(f"{what} must be a number (got {value!r})") from exc
    if not math.isfinite(out):
        raise error(f"{what} must be finite (got {value!r})")
    return out
