"""Static description of the seven benchmarks: splits, expected counts, answer types, hub ids.

One table drives adapters, sources, expectations and the manifest, so a count or a split name
is written once. Errors raised by the data package live here too (they are ``UserError``
subclasses: the CLI prints them and exits 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from components.data.item import ANSWER_TYPES  # noqa: F401  (re-exported: one list of answer types)
from components.errors import UserError

RECORD_COLUMNS = ("id", "benchmark", "split", "question", "choices", "answer", "answer_type", "meta")
"""Column order of every prepared parquet file (the normalised record, docs/architecture.md)."""



class DataError(UserError):
    """Malformed raw input: the message names benchmark, file and line/row."""


class DataSourceError(UserError):
    """No source (mirror, hub, package) could serve a benchmark: lists each try and the fix."""


class DataValidationError(UserError):
    """A great-expectations suite failed; ``report`` carries the markdown report text."""

    def __init__(self, message: str, report: str = "") -> None:
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class BenchmarkSpec:
    """Everything fixed about one benchmark."""

    name: str
    """Benchmark key used in ids, folders and metric names."""
    answer_type: str
    """One of ANSWER_TYPES; uniform within a benchmark."""
    expected: dict[str, int]
    """split -> expected row count (validated by the GX suite)."""
    mirror_files: dict[str, tuple[str, ...]]
    """split -> files (relative to the mirror root) that hold it; globs allowed for MMLU."""
    hub_id: str
    """Hugging Face dataset id used by the hub fallback."""
    hub_config: str | None = None
    """Hub config name (``main`` for gsm8k, ``all`` for mmlu, ``raw`` for aqua)."""
    hub_splits: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """our split -> hub splits concatenated into it (hub MultiArith/SVAMP are re-split 70/30)."""
    n_choices: int | None = None
    """Number of options for choice benchmarks."""
    letters: str = ""
    """Allowed answer letters for choice benchmarks."""


SPECS: dict[str, BenchmarkSpec] = {
    "mmlu": BenchmarkSpec(
        "mmlu",
        "choice",
        {"test": 14042, "val": 1531, "dev": 285},
        {s: (f"mmlu/data/{s}/*_{s}.csv",) for s in ("test", "val", "dev")},
        "cais/mmlu",
        "all",
        {"test": ("test",), "val": ("validation",), "dev": ("dev",)},
        n_choices=4,
        letters="ABCD",
    ),
    "gsm8k": BenchmarkSpec(
        "gsm8k",
        "numeric",
        {"test": 1319, "train": 7473},
        {"test": ("gsm8k/test.jsonl",), "train": ("gsm8k/train.jsonl",)},
        "openai/gsm8k",
        "main",
        {"test": ("test",), "train": ("train",)},
    ),
    "multiarith": BenchmarkSpec(
        "multiarith",
        "numeric",
        {"test": 600},
        {"test": ("multiarith/MultiArith.json",)},
        "ChilleD/MultiArith",
        None,
        {"test": ("train", "test")},
    ),
    "svamp": BenchmarkSpec(
        "svamp",
        "numeric",
        {"test": 1000},
        {"test": ("svamp/SVAMP.json",)},
        "ChilleD/SVAMP",
        None,
        {"test": ("train", "test")},
    ),
    "aqua": BenchmarkSpec(
        "aqua",
        "choice",
        {"test": 254, "dev": 254},
        {"test": ("aqua/test.json",), "dev": ("aqua/dev.json",)},
        "deepmind/aqua_rat",
        "raw",
        {"test": ("test",), "dev": ("validation",)},
        n_choices=5,
        letters="ABCDE",
    ),
    "math500": BenchmarkSpec(
        "math500",
        "math",
        {"test": 500},
        {"test": ("math500/test.jsonl",)},
        "HuggingFaceH4/MATH-500",
        None,
        {"test": ("test",)},
    ),
    "humaneval": BenchmarkSpec(
        "humaneval",
        "code",
        {"test": 164},
        {"test": ("humaneval/HumanEval.jsonl.gz",)},
        "openai/openai_humaneval",
        None,
        {"test": ("test",)},
    ),
}

BENCHMARK_NAMES: tuple[str, ...] = tuple(SPECS)


def get_spec(name: str) -> BenchmarkSpec:
    """Return the spec of ``name`` or raise a ``DataError`` listing the known benchmarks."""
    try:
        return SPECS[name]
    except KeyError:
        raise DataError(f"unknown benchmark {name!r} (known: {', '.join(BENCHMARK_NAMES)})") from None
