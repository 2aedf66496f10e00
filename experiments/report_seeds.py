"""Replicates: one recipe trained on more than one seed, side by side (the report's "Seeds" section).

Two trained results files are replicates when their effective overrides are equal once every
``gspo.seed=`` entry is removed, and their settings (model, team, message cap, item sample) are
equal: only the training seed differs. The section shows, per recipe run on two or more seeds, each
seed's total tokens against the untrained MAS, its paired accuracy difference and its held-out
silence, then the spread across seeds (max − min) overall and on the benchmark where the seeds
differ most. A single-seed difference between two recipes reads against that spread: with one
seed per recipe it cannot be told from the seed-to-seed variation of either.
"""

from __future__ import annotations

from collections.abc import Mapping

from experiments.evidence import BASELINES, MAIN, UNTRAINED, cells_of, versus_untrained
from experiments.results import ResultsFile

SEED_KEY = "gspo.seed="


def recipe_key(res: ResultsFile) -> tuple[str, ...]:
    """What makes a trained run the run it is, the training seed aside: the effective overrides
    without ``gspo.seed=`` entries, plus the settings that comparisons must share and the evaluated
    item ids."""
    overrides = tuple(o for o in res.overrides if not o.replace(" ", "").startswith(SEED_KEY))
    settings = tuple(f"{k}={res.settings[k]!r}" for k in sorted(res.settings))
    return (res.profile, *overrides, "|", *settings, res.item_ids_sha256)


def replicate_groups(results: Mapping[str, ResultsFile]) -> list[list[str]]:
    """Names of trained results files grouped by :func:`recipe_key`, seeds ascending; only groups of
    two or more distinct seeds, in the order their first member appears in ``results``."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for name, res in results.items():
        if res.kind == "gspo":
            groups.setdefault(recipe_key(res), []).append(name)
    out = []
    for names in groups.values():
        if len({results[n].seed for n in names}) >= 2:
            out.append(sorted(names, key=lambda n: (results[n].seed, n)))
    return out


def _silence(res: ResultsFile) -> str:
    counts = (res.silence or {}).get(MAIN)
    if counts is None:
        return "-"
    sent = sum(map(sum, counts.sent))
    return f"{sum(map(sum, counts.silent)) / sent:.2f}" if sent else "-"


def _ratio(a: int, b: int) -> float:
    return a / b if b else float("inf")


def seeds_section(results: Mapping[str, ResultsFile]) -> list[str]:
    """Markdown lines of the "Seeds" section ([] when no recipe ran on two seeds or there is no
    untrained MAS to compare with)."""
    base = cells_of(results, BASELINES, UNTRAINED)
    groups = replicate_groups(results)
    if base is None or not groups:
        return []
    md = ["## Seeds: one recipe, more than one training seed", "",
          "Trained runs whose overrides differ only in `gspo.seed` (same settings and item sample). "
          "Tokens are total tokens against the untrained MAS; accuracy differences are paired over "
          "the shared items. The spread (max − min across seeds) is what one seed of a recipe can "
          "vary by: a single-seed difference between two recipes smaller than it is within what the "
          "seed alone moves.", "",
          "| run | seed | total tokens vs untrained MAS | accuracy difference | held-out silent / sent messages "
          "| peak KL from base |",
          "|---|---|---|---|---|---|"]
    notes: list[str] = []
    for names in groups:
        ratios, diffs, per_bench = [], [], {}
        for name in names:
            v, cells = versus_untrained(results, name), cells_of(results, name)
            if v is None or cells is None:
                continue
            ratios.append(v.ratio)
            diffs.append(v.diff.diff)
            for b in v.trained.benchmarks:
                per_bench.setdefault(b, []).append(_ratio(cells[b].tokens_total, base[b].tokens_total))
            kl_steps = [h["gspo/kl_base"] for h in results[name].history if "gspo/kl_base" in h]
            kl = f"{max(kl_steps):.2g}" if kl_steps else "-"
            md.append(f"| {name} | {results[name].seed} | {v.ratio:.2f}x | {v.diff.diff:+.3f} ± {v.diff.se:.3f} | "
                      f"{_silence(results[name])} | {kl} |")
        if len(ratios) < 2:
            continue
        widest = max(per_bench.items(), key=lambda kv: (max(kv[1]) - min(kv[1]), kv[0]))
        notes.append(f"- {', '.join(names)}: spread across {len(ratios)} seeds {max(ratios) - min(ratios):.2f}x "
                     f"in total tokens ({min(ratios):.2f}x – {max(ratios):.2f}x), {max(diffs) - min(diffs):.3f} in "
                     f"accuracy difference; widest on {widest[0]}: {min(widest[1]):.2f}x – {max(widest[1]):.2f}x")
    return md + [""] + notes + ([""] if notes else [])
