"""Keep the systems a baselines file already holds, evaluate only the missing ones (``--resume``).

A baselines file costs one full evaluation per system, and the untrained 3x2 MAS alone takes an
hour on two CPU cores at the results profile. Adding a system to ``eval.baselines`` (prior only,
say) should cost that system's evaluation, not all of them again. ``experiments run --only
baselines --resume`` therefore keeps the systems of the existing file and evaluates the rest.

That is sound only when the kept systems would come out the same today, so :func:`plan_carry`
refuses, before anything runs, a file that was not evaluated under this very config except for the
list of systems (its config hash must equal this config's with ``eval.baselines`` set to the
file's systems, in some order: JSON files keep no key order), on another version of the prepared
data (``data/manifest.json`` sha256), or on another machine (greedy bf16 decodes differ between
machines, and one file must be comparable row by row). :func:`merge_carried` then joins the fresh
evaluation and the kept systems, after checking that both saw the same items, and records where
each kept system came from (:class:`~experiments.results.CarriedSystems`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

from components.config import Config
from components.machine import describe
from experiments.definitions import ExperimentError, settings_diff, settings_of
from experiments.results import CarriedSystems, ResultsFile
from experiments.schema import study_section

MAX_PERMUTED = 7
"""systems whose orders are tried against a file's config hash (7! = 5040 hashes, well under a second)"""


def with_systems(cfg: Config, systems: Sequence[str]) -> Config:
    """``cfg`` evaluating ``systems`` as its baselines (nothing else changed)."""
    return cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"baselines": list(systems)})})


def _evaluated_under(cfg: Config, res: ResultsFile) -> bool:
    """Whether ``res`` was evaluated under ``cfg`` but for the list of systems."""
    systems = list(res.eval)
    if len(systems) > MAX_PERMUTED:
        raise ExperimentError(f"{res.name}: {len(systems)} systems; --resume checks at most {MAX_PERMUTED}")
    return any(with_systems(cfg, order).hash() == res.config_hash for order in itertools.permutations(systems))


def plan_carry(cfg: Config, existing: ResultsFile, where: str | Path, *, manifest_sha256: str | None,
               machine: dict) -> list[str]:
    """The systems of ``cfg.eval.baselines`` that ``existing`` lacks (in config order), after
    checking that its systems can be kept; :class:`ExperimentError` names the file and the reason."""
    rerun = "run without --resume to evaluate every system again (the file is then replaced)"
    if existing.kind != "baselines":
        raise ExperimentError(f"{where}: a {existing.kind} results file, not baselines; {rerun}")
    if not _evaluated_under(cfg, existing):
        diff = settings_diff(existing.settings, settings_of(cfg))
        what = (f" (it differs in {'; '.join(diff)})" if diff else " (a setting the results file does not list "
                "differs, or the code's config gained a field since the file was written)")
        raise ExperimentError(f"{where}: its systems were evaluated under another config than this run{what}; "
                              f"{rerun}")
    split = study_section(cfg).eval_split  # not in the config hash (experiments.* is left out of it)
    if existing.eval_split != split:
        raise ExperimentError(f"{where}: its systems were evaluated on {existing.eval_split}, this run evaluates "
                              f"{split} (experiments.eval_split); {rerun}")
    if existing.data_manifest_sha256 != manifest_sha256:
        raise ExperimentError(f"{where}: evaluated on another version of the prepared data (data/manifest.json "
                              f"sha256 {str(existing.data_manifest_sha256)[:12]}, now {str(manifest_sha256)[:12]}); "
                              f"{rerun}")
    if existing.machine != machine:
        raise ExperimentError(f"{where}: measured on {describe(existing.machine)}, this is {describe(machine)} "
                              f"(greedy bf16 decodes differ between machines); {rerun}")
    return [s for s in cfg.eval.baselines if s not in existing.eval]


SHARED = ("kind", "name", "profile", "model", "eval_seed", "limit", "benchmarks", "item_ids_sha256", "eval_split",
          "devset", "data_manifest_sha256", "settings", "machine", "last_k")
"""what the fresh and the kept part of one baselines file must agree on"""


def merge_carried(cfg: Config, fresh: ResultsFile, kept: ResultsFile) -> ResultsFile:
    """One baselines file for ``cfg``: the systems ``fresh`` evaluated, and ``kept``'s other systems
    of ``cfg.eval.baselines`` (systems outside it are dropped), in config order. The top level is
    the fresh run's (commit, MLflow runs, seconds, overrides), its config hash ``cfg``'s; ``carried``
    says which systems came from which earlier run. Raises :class:`ExperimentError` when the two
    parts differ in anything a comparison shares (items above all)."""
    for key in SHARED:
        if getattr(fresh, key) != getattr(kept, key):
            raise ExperimentError(f"{kept.name}: the kept and the freshly evaluated systems differ in {key} "
                                  f"({getattr(kept, key)!r} vs {getattr(fresh, key)!r}); nothing was written")
    wanted = list(cfg.eval.baselines)
    if set(fresh.eval) & set(kept.eval) or not set(fresh.eval) <= set(wanted):
        raise ExperimentError(f"{kept.name}: fresh systems {sorted(fresh.eval)} must be new and in eval.baselines "
                              f"{wanted} (kept: {sorted(kept.eval)})")
    keep = [s for s in wanted if s in kept.eval]
    missing = [s for s in wanted if s not in kept.eval and s not in fresh.eval]
    if missing:
        raise ExperimentError(f"{kept.name}: no evaluation of {missing} (eval.baselines {wanted})")
    earlier = [c.model_copy(update={"systems": [s for s in c.systems if s in keep]}) for c in kept.carried or []]
    earlier = [c for c in earlier if c.systems]
    before = {s for c in kept.carried or [] for s in c.systems}
    own = [s for s in keep if s not in before]
    if own:
        earlier.append(CarriedSystems(systems=own, git_commit=kept.git_commit, config_hash=kept.config_hash,
                                      overrides=list(kept.overrides), eval_run_id=kept.mlflow.get("eval_run_id"),
                                      eval_seconds=kept.eval_seconds))

    def part(field: str) -> dict | None:
        a, b = getattr(fresh, field), getattr(kept, field)
        if a is None and b is None:
            return None
        joined = {**(b or {}), **(a or {})}
        return {s: joined[s] for s in wanted if s in joined}

    return ResultsFile.model_validate({
        **fresh.model_dump(), "config_hash": cfg.hash(), "eval": part("eval"), "summary": part("summary"),
        "items": part("items"), "silence": part("silence"), "carried": earlier or None,
    })
