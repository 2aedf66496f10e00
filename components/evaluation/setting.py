"""The setting an evaluation ran under: what two numbers must share to be compared.

Two evaluations are comparable only when they graded the same items (benchmarks, split, seeded
sample, hence limit and seed) of the same data (the prepared manifest's sha256) with the same
multi-agent protocol (every ``mas`` setting but the sampling and speed knobs, which greedy
evaluation does not use), the weights' compute precision (``model.dtype``: bf16 and fp32 decode
differently, README "Numbers") and the code-execution timeout (``eval.code_timeout_s``: a program
that needs 8 s passes at 10 s and fails at 5 s). :meth:`EvalSetting.key` names that setting in registry tags; the
promotion gate compares a candidate with a champion only under one key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from components.config import Config, MasConfig
from components.config_sections import NOT_PROTOCOL, protocol_of  # noqa: F401  (NOT_PROTOCOL: re-exported)
from components.data.devset import DEVSET, load_dev_items
from components.data.item import Item
from components.data.prepare import load_split, manifest_sha256
from components.data.sampling import ids_sha256, sample_items


def item_ids_sha256(item_ids: dict[str, list[str]]) -> str:
    """Identity of an evaluation sample: sha256 of the item ids per benchmark."""
    return ids_sha256(item_ids)


def sample_split(cfg: Config, data_dir: Path, benchmarks: Sequence[str], split: str,
                 limit: int | None) -> tuple[dict[str, list[Item]], dict[str, dict[str, Any]] | None]:
    """The items an evaluation of ``split`` grades per benchmark, and (``split`` = ``devset``) what the
    meta records of each benchmark's dev source (None for a prepared split).

    A prepared split: ``limit`` items ranked by ``eval.seed`` (:func:`sample_items`). ``devset``: the dev
    items (:mod:`components.data.devset`) that exclude the test sample of ``eval.limit`` /
    ``eval.seed`` (always the config's: a ``--limit`` must not move the excluded items), the first
    ``limit`` of them when ``limit`` is given (a cap; None: the dev set's own size)."""
    if split != DEVSET:
        return {b: sample_items(load_split(data_dir, b, split, cfg.data), limit, cfg.eval.seed,
                                where=f"{data_dir}/{b}/{split}") for b in benchmarks}, None
    trained = set(cfg.data.train_sources)
    items: dict[str, list[Item]] = {}
    record: dict[str, dict[str, Any]] = {}
    for b in benchmarks:
        dev = load_dev_items(data_dir, b, test_limit=cfg.eval.limit, eval_seed=cfg.eval.seed, limits=cfg.data)
        if limit is not None:
            dev = replace(dev, items=dev.items[:limit])
        items[b] = dev.items
        record[b] = dev.describe(in_train_sources=f"{b}/{dev.split}" in trained)
    return items, record


class EvalSetting(BaseModel):
    """Benchmarks, split, sample, data and protocol of one evaluation (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    benchmarks: tuple[str, ...]
    split: str
    limit: int | None
    seed: int
    item_ids_sha256: str
    data_manifest_sha256: str | None
    protocol: dict[str, Any]
    dtype: str
    code_timeout_s: float

    def key(self) -> str:
        """12 hex characters of the sha256 of the canonical JSON (a registry tag component)."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def describe(self) -> str:
        """One line for messages and logs."""
        p = self.protocol
        return (f"{', '.join(self.benchmarks)} / {self.split}, {self.limit or 'all'} items each, seed {self.seed}, "
                f"data {str(self.data_manifest_sha256)[:12]}, {p.get('agents')} agents x {p.get('rounds')} rounds "
                f"{p.get('topology')}, {self.dtype}, code timeout {self.code_timeout_s:g} s")

    def params(self) -> dict[str, str]:
        """Flat ``setting.*`` MLflow params of an evaluation run."""
        out = {"setting.key": self.key(), "setting.benchmarks": ",".join(self.benchmarks),
               "setting.split": self.split, "setting.limit": str(self.limit), "setting.seed": str(self.seed),
               "setting.item_ids_sha256": self.item_ids_sha256,
               "setting.data_manifest_sha256": str(self.data_manifest_sha256), "setting.dtype": self.dtype,
               "setting.code_timeout_s": str(self.code_timeout_s)}
        out.update({f"setting.protocol.{k}": json.dumps(v) if isinstance(v, list | dict) else str(v)
                    for k, v in self.protocol.items()})
        return out


def setting_of(cfg: Config, item_ids: dict[str, list[str]], *, split: str, limit: int | None,
               data_manifest_sha256: str | None, mas: MasConfig | None = None) -> EvalSetting:
    """The setting of an evaluation that graded ``item_ids`` with ``cfg`` (``mas``: the evaluated system's)."""
    return EvalSetting(benchmarks=tuple(sorted(item_ids)), split=split, limit=limit, seed=cfg.eval.seed,
                       item_ids_sha256=item_ids_sha256({b: list(ids) for b, ids in item_ids.items()}),
                       data_manifest_sha256=data_manifest_sha256, protocol=protocol_of(mas or cfg.mas),
                       dtype=_decoding_dtype(cfg.model.dtype), code_timeout_s=float(cfg.eval.code_timeout_s))


def _decoding_dtype(dtype: str) -> str:
    """The precision the weights decode in: ``auto`` resolved on this machine (bf16 on a bf16 GPU,
    float32 otherwise), so an ``auto`` evaluation on a GPU and one on a CPU are not one setting."""
    if dtype != "auto":
        return dtype
    from components.models.loading import default_device, resolve_dtype

    return str(resolve_dtype(dtype, default_device())).removeprefix("torch.")


def planned_setting(cfg: Config, *, limit: int | None = None, split: str = "test",
                    data_dir: str | Path | None = None) -> EvalSetting:
    """The setting ``agent-gspo evaluate`` would run under with ``cfg`` (reads and samples the data)."""
    data = Path(data_dir if data_dir is not None else cfg.data.out_dir)
    if split != DEVSET:
        limit = cfg.eval.limit if limit is None else limit
    items, _ = sample_split(cfg, data, cfg.eval.benchmarks, split, limit)
    ids = {b: [i.id for i in its] for b, its in items.items()}
    return setting_of(cfg, ids, split=split, limit=limit, data_manifest_sha256=manifest_sha256(data))
