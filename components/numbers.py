"""The one check of "a finite number" for values read from files (metrics, results summaries).

A bool is an ``int`` to Python but not a number to a reader of ``metrics.json``: ``true`` is
refused, like NaN and ±inf (JSON cannot even write them portably)."""

from __future__ import annotations

import math
from typing import Any


def is_finite_number(value: Any) -> bool:
    """True for an int or float (not a bool) that is neither NaN nor infinite."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
