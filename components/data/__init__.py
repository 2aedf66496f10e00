"""Benchmark data: adapters (mirror / hub / package), GX validation, atomic prepare, manifest.

Heavy imports (great-expectations ~3 s, datasets ~1.5 s) live in submodules and are only
paid by callers that prepare or validate; ``spec`` and ``adapters`` stay light.
"""

from components.data.spec import (
    BENCHMARK_NAMES,
    RECORD_COLUMNS,
    SPECS,
    BenchmarkSpec,
    DataError,
    DataSourceError,
    DataValidationError,
    DataWriteError,
    get_spec,
)

__all__ = [
    "BENCHMARK_NAMES",
    "RECORD_COLUMNS",
    "SPECS",
    "BenchmarkSpec",
    "DataError",
    "DataSourceError",
    "DataValidationError",
    "DataWriteError",
    "get_spec",
]
