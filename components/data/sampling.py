"""Seeded, order-independent item sampling and per-batch seeds.

Why hash-ranking instead of ``random.sample``: ``random.sample(items, n)`` depends on the order
the rows come back from parquet and on Python's RNG algorithm; ranking each item by
``sha256(f"{seed}:{id}")`` gives the same ids for the same seed and limit no matter how the file is
ordered, and a larger ``limit`` is a superset of a smaller one (the first N of the same ranking),
so ``--limit 50`` results stay comparable with ``--limit 100`` on the common items.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

from components.data.item import Item
from components.errors import UserError

EVAL_SPLIT = "test"
"""the split every benchmark is evaluated on (training never uses its sampled items)"""
DEVSET = "devset"
"""what an evaluation names as its split to grade the dev set (components/data/devset.py) instead"""


class SamplingError(UserError):
    """Bad sampling input: a non-positive limit or duplicate item ids."""


def _rank(seed: int, item_id: str) -> str:
    return hashlib.sha256(f"{seed}:{item_id}".encode()).hexdigest()


def sample_items(items: Sequence[Item], limit: int | None, seed: int, *, where: str = "items") -> list[Item]:
    """The first ``limit`` items ranked by ``sha256(f"{seed}:{id}")`` (all items when ``limit`` is None).

    The returned list is in ranking order (stable across runs). ``where`` names the source in errors.
    """
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise SamplingError(f"{where}: limit must be a positive integer or null (eval.limit / --limit), got {limit!r}")
    ids = [item.id for item in items]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise SamplingError(f"{where}: duplicate item ids {dup}; ids must be unique for a stable sample")
    order = sorted(range(len(items)), key=lambda k: (_rank(seed, ids[k]), ids[k]))
    if limit is not None:
        order = order[:limit]
    return [items[k] for k in order]


def derived_seed(seed: int, *parts: object) -> int:
    """A 31-bit seed from ``seed`` and labels (benchmark, system, batch index).

    Each (benchmark, system, batch) gets its own sampling stream, so adding a baseline or a
    benchmark never shifts the random numbers another one sees.
    """
    text = ":".join([str(seed), *(str(p) for p in parts)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") & 0x7FFFFFFF


def ids_sha256(item_ids: Mapping[str, Sequence[str]]) -> str:
    """Identity of a sample: sha256 of the JSON ``{benchmark: [ids in sample order]}`` (keys sorted).

    An evaluation's ``item_ids_sha256`` and the dev set's id hash (components/data/devset.py) are this."""
    blob = json.dumps({b: list(ids) for b, ids in item_ids.items()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()
