"""The dev set: items the study may choose recipes, caps and budgets on, never the test items it reports.

Issue 52: "a dev set drawn from each benchmark's train or validation split, disjoint from the test
sample and recorded by id hash; recipes, caps and budgets are chosen on it; each pre-registered
recipe touches the test items once". Where a benchmark ships a non-test split the dev items come
from it (:data:`DEV_SOURCES` says which and why). Four benchmarks ship a test split only
(MultiArith, SVAMP, MATH-500, HumanEval): their dev items are test-split items OUTSIDE the seeded
test sample (``sample_items(test, eval.limit, eval.seed)``), so they are disjoint from every item
the study reports, not from the benchmark's test split.

The dev sample ranks its pool with its own seed (:func:`dev_seed`, derived from ``eval.seed`` and
the label ``devset``), not by reusing the test ranking. The official splits are disjoint from the
test split by construction; the complement pools by subtraction, whatever the seed. The sample is
identified by the sha256 of its ids (:func:`components.data.sampling.ids_sha256`, the convention of
an evaluation's ``item_ids_sha256``), so a results file evaluated on it says which items it saw.

Caveat, recorded in the evaluation meta (``in_train_sources``): a recipe that trains on the dev
source (``data.train_sources`` with ``aqua/dev``, ``mmlu/val``, ``gsm8k/train`` or, for
HumanEval, ``humaneval/test``, whose training rest IS this pool) has seen the dev items.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.data.item import Item
from components.data.prepare import load_split
from components.data.sampling import DEVSET, EVAL_SPLIT, derived_seed, ids_sha256, sample_items
from components.data.spec import DataError

__all__ = ["DEVSET", "DEV_SOURCES", "DevSample", "DevSource", "dev_items", "dev_seed", "devset_sha256",
           "load_dev_items"]


@dataclass(frozen=True)
class DevSource:
    """Where one benchmark's dev items come from, and how many."""

    split: str | None
    """an official non-test split, or None: the test split less the seeded test sample"""
    n: int
    """dev items (at the study's eval.limit 100: 100 where the pool allows, else the whole pool)"""
    why: str


DEV_SOURCES: dict[str, DevSource] = {
    "aqua": DevSource("dev", 100, "AQuA-RAT's official dev split (254 items), disjoint from its test split"),
    "mmlu": DevSource("val", 100, "MMLU's official validation split (1,531 items); its 'dev' split is the "
                                  "285 five-shot exemplars (5 per subject), too few per subject to sample 100"),
    "gsm8k": DevSource("train", 100, "GSM8K has no validation split; its train split (7,473) is disjoint from test"),
    "multiarith": DevSource(None, 100, "test split only (600): the 500 items outside the 100-item test sample"),
    "svamp": DevSource(None, 100, "test split only (1,000 as prepared): the 900 items outside the test sample"),
    "math500": DevSource(None, 100, "test split only (500): the 400 items outside the test sample"),
    "humaneval": DevSource(None, 64, "test split only (164): the 64 problems outside the 100-item test sample, "
                                     "all of them"),
}
"""benchmark -> dev source (see the module docstring)"""


@dataclass(frozen=True)
class DevSample:
    """The dev items of one benchmark and where they came from."""

    benchmark: str
    source: str
    """``<benchmark>/<split>``, or ``<benchmark>/test-minus-sample`` for a test-only benchmark"""
    pool: int
    """items the sample was drawn from"""
    seed: int
    items: list[Item]

    @property
    def ids_sha256(self) -> str:
        """sha256 of ``{benchmark: ids in sample order}`` (an evaluation's ``item_ids_sha256`` convention)."""
        return ids_sha256({self.benchmark: [i.id for i in self.items]})

    @property
    def split(self) -> str:
        """the prepared split the items were read from"""
        return self.source.split("/", 1)[1].removesuffix("-minus-sample")

    def describe(self, in_train_sources: bool = False) -> dict[str, Any]:
        """What an evaluation records about it (meta ``devset.<benchmark>``)."""
        return {"source": self.source, "split": self.split, "pool": self.pool, "n": len(self.items), "seed": self.seed,
                "ids_sha256": self.ids_sha256, "in_train_sources": in_train_sources}


def dev_seed(eval_seed: int) -> int:
    """The dev sample's own ranking seed: a separate stream from ``eval.seed``'s test ranking."""
    return derived_seed(eval_seed, DEVSET)


def dev_source(benchmark: str) -> DevSource:
    """:data:`DEV_SOURCES` entry of ``benchmark`` (:class:`DataError` naming the known ones)."""
    if benchmark not in DEV_SOURCES:
        raise DataError(f"{benchmark}: no dev set defined (dev sets: {', '.join(DEV_SOURCES)})")
    return DEV_SOURCES[benchmark]


def dev_items(benchmark: str, items: Sequence[Item], *, test_limit: int | None, eval_seed: int,
              n: int | None = None) -> DevSample:
    """The dev sample of ``benchmark`` from ``items``: its :data:`DEV_SOURCES` split's items, or, for a
    test-only benchmark, its TEST split's items (the seeded test sample ``sample_items(items,
    test_limit, eval_seed)`` is removed first). ``n`` defaults to the table's.

    Raises :class:`DataError` naming the benchmark and the numbers when ``test_limit`` is None for a
    test-only benchmark (the whole test split is the test sample: no complement) or when the pool
    holds fewer than ``n`` items (e.g. HumanEval at eval.limit 120: 44 left, 64 wanted)."""
    src = dev_source(benchmark)
    n = src.n if n is None else n
    if n < 1:
        raise DataError(f"{benchmark}: dev set size must be >= 1, got {n}")
    where = f"{benchmark}/{src.split or EVAL_SPLIT}"
    if src.split is None:
        if test_limit is None:
            raise DataError(f"{benchmark}: no dev set with eval.limit null: the whole test split ({len(items)} items) "
                            "is the test sample, and this benchmark has no other split to draw dev items from")
        held = {i.id for i in sample_items(items, test_limit, eval_seed, where=where)}
        pool = [i for i in items if i.id not in held]
        source = f"{benchmark}/{EVAL_SPLIT}-minus-sample"
        whence = f"{len(items)} test items less the {len(held)}-item test sample (eval.limit {test_limit}, " \
                 f"eval.seed {eval_seed})"
    else:
        pool, source, whence = list(items), where, f"{len(items)} items of {where}"
    if len(pool) < n:
        raise DataError(f"{benchmark}: dev pool too small: {whence} leaves {len(pool)}, the dev set needs {n}")
    seed = dev_seed(eval_seed)
    return DevSample(benchmark, source, len(pool), seed, sample_items(pool, n, seed, where=source))


def load_dev_items(data_dir: str | Path, benchmark: str, *, test_limit: int | None, eval_seed: int,
                   n: int | None = None, limits: Any = None) -> DevSample:
    """:func:`dev_items` of the prepared split under ``data_dir`` (``limits``: ``data.max_*_chars``)."""
    split = dev_source(benchmark).split or EVAL_SPLIT
    return dev_items(benchmark, load_split(data_dir, benchmark, split, limits), test_limit=test_limit,
                     eval_seed=eval_seed, n=n)


def devset_sha256(samples: Sequence[DevSample]) -> str:
    """The id hash of several benchmarks' dev samples: what an evaluation of them records as
    ``item_ids_sha256``."""
    return ids_sha256({s.benchmark: [i.id for i in s.items] for s in samples})
