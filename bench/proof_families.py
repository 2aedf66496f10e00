"""Per-family held-out numbers of the split-information task, second version (``splitinfo2``, issue 52).

Plays the held-out items that ``agent-gspo evaluate`` would sample (``eval.limit``, ``eval.seed``)
greedily with a policy, under the profile's ``mas`` settings, and breaks the results down by every
axis the items record (:mod:`components.data.splitinfo_v2`): fact family (items nobody was
informed on are their own group), none family, distractor family, question family, team size,
number informed, note position. Per group: accuracy over answerable items, the share of silent
turns of uninformed and of informed agents, how often an agent whose note carried a distracting
number said that number, how often the team's final answer was a distracting number, and total
tokens per episode. ``--untrained`` adds the base model (silence row untrained: ``mas_untrained``)
on the same items, and each group's tokens as a multiple of its; ``--prior`` the base model with the
silence prior and no RL (``mas_prior``); ``--single`` one agent instead of a team, the base model as the
evaluation's baselines play it (``single_cot``: one lone solver, greedy; ``self_consistency``:
``eval.self_consistency_k`` lone solvers sampled at ``mas.temperature`` and a majority vote), each
solver reading the note of the team's first informed agent (so it holds the fact whenever anyone
would; components/mas/teams.py), the team that every trained one is set beside at equal tokens.
``--model`` repeats (``LABEL=MODEL``): every system plays the same items, and ``--out`` holds them all
with the items' id hash.

    python bench/proof_families.py --profile proof_v2 --untrained --prior \\
        --model agent_gspo_s0=runs/proof_v2/agent_gspo_s0/final --out results/proof_v2/families.json

Needs ``agent-gspo prepare --benchmarks splitinfo2`` (``--data``). Prints one table per axis.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/proof_families.py`: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from components.data.item import Item  # noqa: E402
from components.mas.records import Episode  # noqa: E402

AXES = ("family", "none", "distractor", "question", "team_size", "informed", "note_first")


def _keys(item: Item) -> dict[str, str]:
    m = item.meta
    fam = m["families"]
    return {"family": m["family"] if m["informed"] else "nobody_informed", "none": fam["none"],
            "distractor": fam["distractor"] or "no_distractor", "question": fam["question"],
            "team_size": str(m["agents"]), "informed": str(len(m["informed"])),
            "note_first": "note_first" if m["note_first"] else "question_first"}


def _rate(values: list[bool]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def _final_is_distractor(items: Sequence[Item], episodes: Sequence[Episode]) -> list[bool | None]:
    """Per item: whether the team's final answer grades as one of its distracting numbers (None: none)."""
    from components.scoring.grader import grade_many  # lazy: math-verify is heavy

    pairs, owner = [], []
    for k, (item, ep) in enumerate(zip(items, episodes, strict=True)):
        for value in item.meta.get("distractor_values") or []:
            pairs.append((dataclasses.replace(item, answer=str(value)), ep.final_answer))
            owner.append(k)
    out: list[bool | None] = [None if not it.meta.get("distractor_values") else False for it in items]
    for k, res in zip(owner, grade_many(pairs), strict=True):
        out[k] = bool(out[k]) or res.correct
    return out


def heard_an_answer(episode: Episode, turn_order: str = "simultaneous") -> list[bool]:
    """Per message of ``episode``: whether its agent had heard a non-silent message before speaking.

    A message j was heard by message i's agent when j was delivered to it (``recipients``) and came
    earlier in time: an earlier round, or the same round spoken in turn (``mas.turn_order``: every
    round under ``in_turn``, round 0 under ``round0_in_turn``) and earlier in the list (the engine
    records messages in speaking order). In a simultaneous round nobody hears the others.
    """
    out = []
    for i, msg in enumerate(episode.messages):
        in_turn = turn_order == "in_turn" or (turn_order == "round0_in_turn" and msg.round == 0)
        out.append(any(not m.silent and msg.agent_id in m.recipients
                       and (m.round < msg.round or (in_turn and m.round == msg.round))
                       for m in episode.messages[:i]))
    return out


def breakdown(items: Sequence[Item], episodes: Sequence[Episode], turn_order: str = "simultaneous",
              solo_agents: int | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """axis -> group -> numbers (see the module docstring); axis ``all`` holds one group, ``all``.

    ``silence_uninformed_heard`` / ``_unheard``: the silence of agents without the fact when they had
    / had not heard an answer before their turn (:func:`heard_an_answer`): silence that depends on
    what was said, not only on the agent's own note. ``solo_agents``: the episodes are those of that
    many lone solvers (single-agent baselines), who read another agent's note (``Seating.note_of``), so
    a distracting number counts against the solver that read that note."""
    from components.mas.teams import episode_team

    finals = _final_is_distractor(items, episodes)
    rows: dict[tuple[str, str], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for item, ep, final in zip(items, episodes, finals, strict=True):
        m = item.meta
        note_of = (episode_team(item, 0, solo_agents, solo=True).note_of if solo_agents
                   else tuple(range(m["agents"])))
        groups = [("all", "all"), *_keys(item).items()]
        for key in groups:
            r = rows[key]
            r["tokens"].append(ep.total_tokens)
            if m["answerable"]:
                r["correct"].append(bool(ep.correct))
            if final is not None:
                r["final_distractor"].append(final)
            for msg, heard in zip(ep.messages, heard_an_answer(ep, turn_order), strict=True):
                (r["silent_informed"] if msg.private else r["silent_uninformed"]).append(msg.silent)
                if not msg.private:
                    r["silent_heard" if heard else "silent_unheard"].append(msg.silent)
                if m["note_kinds"][note_of[msg.agent_id]] == "distractor":
                    spoke = not msg.silent and any(v in msg.text for v in m["distractor_values"])
                    r["distractor_said"].append(spoke)
    out: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for (axis, group), r in sorted(rows.items()):
        out[axis][group] = {"items": len(r["tokens"]), "answerable": len(r["correct"]),
                            "accuracy": _rate(r["correct"]), "silence_uninformed": _rate(r["silent_uninformed"]),
                            "silence_informed": _rate(r["silent_informed"]),
                            "silence_uninformed_heard": _rate(r["silent_heard"]),
                            "silence_uninformed_unheard": _rate(r["silent_unheard"]),
                            "distractor_said": _rate(r["distractor_said"]),
                            "final_distractor": _rate(r["final_distractor"]),
                            "tokens_total": round(sum(r["tokens"]) / len(r["tokens"]), 1)}
    return dict(out)


def with_ratio(trained: dict, untrained: dict) -> dict:
    """``trained`` with ``tokens_vs_untrained`` per group (its tokens / the untrained team's)."""
    for axis, groups in trained.items():
        for group, nums in groups.items():
            base = untrained.get(axis, {}).get(group, {}).get("tokens_total")
            nums["tokens_vs_untrained"] = round(nums["tokens_total"] / base, 3) if base else None
    return trained


def table(result: dict[str, dict[str, dict[str, Any]]]) -> str:
    cols = ("items", "answerable", "accuracy", "silence_uninformed", "silence_uninformed_heard",
            "silence_uninformed_unheard", "silence_informed", "distractor_said",
            "final_distractor", "tokens_total", "tokens_vs_untrained")
    lines = []
    for axis in ("all", *AXES):
        lines += [f"\n{axis}", "| group | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
        for group, nums in result.get(axis, {}).items():
            cells = ("-" if nums.get(c) is None else str(nums[c]) for c in cols)
            lines.append(f"| {group} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def play(cfg: Any, model_name: str, items: list[Item], device: str, *, prior: bool = False,
         data_dir: str = "data") -> list[Episode]:
    """Greedy episodes of ``model_name`` on ``items``; ``prior``: the base model with the silence prior
    (``model.silence_prior``, calibrated on ``data.train_sources``: the training runs' step-0 policy)."""
    from components.data.train_items import load_train_items
    from components.mas.engine import RolloutEngine
    from components.mas.environment import Environment
    from components.mas.prior import apply_silence_prior
    from components.models import load_policy

    model, tok = load_policy(model_name, cache_dir=cfg.model.cache_dir, dtype=cfg.model.dtype, device=device,
                             silence_marker=cfg.mas.silence_marker)
    if prior:
        reached = apply_silence_prior(model, tok, cfg.mas, load_train_items(cfg, Path(data_dir)),
                                      cfg.model.silence_prior, cfg.model.silence_calibration)
        print(f"  silence prior: P(silence first) = {reached:.3f}", flush=True)
    engine = RolloutEngine(model, tok, cfg.mas, device=device)
    episodes: list[Episode] = []
    for start in range(0, len(items), cfg.eval.batch_size):
        episodes += Environment(engine).play(items[start:start + cfg.eval.batch_size], 1, seed=cfg.eval.seed,
                                             greedy=True)
        print(f"  {model_name}: {len(episodes)}/{len(items)} items", flush=True)
    return episodes


SINGLE = ("single_cot", "self_consistency")
"""the single-agent systems ``--single`` plays (the evaluation's baselines of those names)"""


def play_single(cfg: Any, name: str, items: list[Item], device: str) -> tuple[list[Episode], int]:
    """Episodes of the base model as the single-agent baseline ``name`` and its number of lone solvers;
    decoded as the evaluation decodes it (components/evaluation/runner.py: CoT greedy, SC sampled)."""
    from components.mas.baselines import BaselineRun, run_baseline
    from components.models import load_policy

    model, tok = load_policy(cfg.model.name, cache_dir=cfg.model.cache_dir, dtype=cfg.model.dtype, device=device,
                             silence_marker=cfg.mas.silence_marker)
    k = cfg.eval.self_consistency_k
    episodes: list[Episode] = []
    for start in range(0, len(items), cfg.eval.batch_size):
        run = BaselineRun(seed=cfg.eval.seed + start, k=k, greedy=name == "single_cot", device=device)
        episodes += run_baseline(name, model, tok, cfg.mas, items[start:start + cfg.eval.batch_size], run)
        print(f"  {name}: {len(episodes)}/{len(items)} items", flush=True)
    return episodes, (1 if name == "single_cot" else k)


def _systems(args: argparse.Namespace, base: str) -> list[tuple[str, str, bool]]:
    """(label, model, with prior) per system to play, in order; labels must be unique."""
    out = [("mas_untrained", base, False)] if args.untrained else []
    out += [("mas_prior", base, True)] if args.prior else []
    out += [(name, base, False) for name in SINGLE] if args.single else []
    for k, spec in enumerate(args.model):
        label, sep, model = spec.partition("=")
        if label in SINGLE and sep:
            raise ValueError(f"--model label {label!r} is reserved for --single")
        out.append((label, model, False) if sep else (f"trained{k}" if k else "trained", spec, False))
    labels = [label for label, _, _ in out]
    if len(set(labels)) != len(labels):
        raise ValueError(f"system labels repeat: {labels}")
    return out


def main(argv: list[str] | None = None) -> int:
    from components.config import load_config
    from components.data.prepare import load_split
    from components.data.sampling import sample_items
    from components.evaluation.setting import item_ids_sha256
    from components.io import write_text_atomic

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="proof_v2")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--model", action="append", default=[],
                    help="a policy to play (a folder, alias or hub id), optionally LABEL=MODEL; repeatable")
    ap.add_argument("--untrained", action="store_true", help="also play the base model (model.name) for the ratio")
    ap.add_argument("--prior", action="store_true", help="also play the base model with the silence prior (no RL)")
    ap.add_argument("--single", action="store_true",
                    help="also play one agent: the base model as single_cot and self_consistency")
    ap.add_argument("--data", default="data")
    ap.add_argument("--limit", type=int, default=None, help="held-out items (default eval.limit)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=None, help="write the numbers as JSON here")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override one param of the profile, e.g. --set mas.turn_order=round0_in_turn (repeatable)")
    args = ap.parse_args(argv)
    if not args.model and not args.untrained and not args.prior and not args.single:
        ap.error("nothing to play: give --model, --untrained, --prior or --single")
    cfg = load_config(args.params, profile=args.profile, overrides=args.overrides)
    try:
        plan = _systems(args, cfg.model.name)
    except ValueError as exc:
        ap.error(str(exc))
    limit = args.limit if args.limit is not None else cfg.eval.limit
    items = sample_items(load_split(args.data, "splitinfo2", "test", cfg.data), limit, cfg.eval.seed,
                         where=f"{args.data}/splitinfo2/test")
    systems = {}
    for label, model, prior in plan:
        print(f"{label}: {model}{' + silence prior' if prior else ''} on {len(items)} items", flush=True)
        if label in SINGLE:
            episodes, solvers = play_single(cfg, label, items, args.device)
            systems[label] = breakdown(items, episodes, cfg.mas.turn_order, solo_agents=solvers)
            continue
        episodes = play(cfg, model, items, args.device, prior=prior, data_dir=args.data)
        systems[label] = breakdown(items, episodes, cfg.mas.turn_order)
    if "mas_untrained" in systems:
        systems = {k: v if k == "mas_untrained" else with_ratio(v, systems["mas_untrained"])
                   for k, v in systems.items()}
    for label, result in systems.items():
        print(f"\n## {label}\n{table(result)}")
    if args.out:
        record = {"profile": args.profile, "overrides": args.overrides, "turn_order": cfg.mas.turn_order,
                  "limit": limit, "eval_seed": cfg.eval.seed,
                  "item_ids_sha256": item_ids_sha256({"splitinfo2": [i.id for i in items]}),
                  "models": {label: model for label, model, _ in plan},
                  "systems": systems}
        write_text_atomic(Path(args.out), json.dumps(record, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
