"""The ``agent-gspo`` argument parser: every command, its flags (each with help text), ``--version``
and the exit codes every command's ``--help`` names. :mod:`components.cli` runs what it parses."""

from __future__ import annotations

import argparse
import functools
import subprocess
from collections.abc import Sequence
from pathlib import Path

from components.config import ALL_BENCHMARKS, BASELINE_NAMES
from components.data.sampling import DEVSET, EVAL_SPLIT
from components.errors import OneLineParser
from components.jobs.base import ROLLOUT_MAX_EPISODES

EXIT_CODES = """exit codes:
  0    done
  1    a process it launched failed (a training rank; its own output says why), or a bug (a traceback)
  2    bad input: a flag, config key, file or row (one line naming it), or a full disk / read-only folder
  130  interrupted (Ctrl-C, SIGINT)
  143  terminated (SIGTERM)
  train: --resume continues from the newest checkpoint after 130 / 143"""
"""what :func:`components.errors.run_command` (and argparse, for a bad flag: 2) return"""

HELPS: dict[str, str] = {
    "prepare": "prepare benchmarks into normalised parquet (mirror > hub > package)",
    "validate": "validate prepared data with great-expectations",
    "rollout": "run multi-agent episodes and print transcripts",
    "train": "GSPO training (in-process, or under torchrun / deepspeed per deepspeed.launcher)",
    "evaluate": "evaluate a policy and the baselines on the seven benchmarks",
    "search": "budget-constrained hyper-parameter search (Optuna)",
    "promote": "gate a registered version against @champion (paired per-item evidence: accuracy and tokens)",
    "run": "the whole pipeline as one Prefect flow",
    "score": "score a JSON-lines predictions file against a benchmark, or re-grade an evaluation's items",
    "experiments": "the study (experiments/, `python -m experiments`): run the paper's experiments, regenerate "
                   "docs/results.md (report)",
    "config": "list every --set key (keys) or print a profile's resolved config as YAML (show)",
}

METRICS_HELP = "also write a small numbers-only metrics JSON here (what the DVC stages track)"
NO_TRACK_HELP = "do not log to MLflow"


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def _seed(text: str) -> int:
    """``--seed``: what numpy, torch and Python's random all accept (as ``gspo.seed``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= value <= 2**32 - 1:
        raise argparse.ArgumentTypeError(f"{value} must be in 0..{2**32 - 1}")
    return value


def comma_names(text: str) -> list[str]:
    """A comma list that must name something: an empty one would silently mean "all"."""
    names = _csv(text)
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r} names nothing (give a comma list, or omit the flag for all)")
    return names


def _known(names: list[str], allowed: Sequence[str], what: str) -> list[str]:
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {what}(s) {unknown} (allowed: {', '.join(allowed)})")
    return names


def _benchmarks(text: str) -> list[str]:
    return _known(comma_names(text), ALL_BENCHMARKS, "benchmark")


def _baselines(text: str) -> list[str]:
    """``--baselines``: checked by name before any model loads (an empty string: none)."""
    return _known(_csv(text), BASELINE_NAMES, "baseline")


@functools.cache
def version_text() -> str:
    """``agent-gspo 0.1.0 (git 1a2b3c4)``: the installed package's version, and the commit of the
    checkout the code runs from when it is a git checkout (an editable install, a worktree)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        text = f"agent-gspo {version('agent-gspo')}"
    except PackageNotFoundError:
        text = "agent-gspo (not installed)"
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return text
    return f"{text} (git {commit})" if commit else text


class _Version(argparse.Action):
    """``--version``, computed only when asked (it runs git)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print the version (package metadata, and the git commit when known) and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(version_text())
        parser.exit(0)


def _common() -> argparse.ArgumentParser:
    common = OneLineParser(add_help=False)
    common.add_argument("--params", default=None, help="params file (default params.yaml or $AGENT_GSPO_PARAMS)")
    common.add_argument("--profile", default=None, help="profile in params.yaml (default, smoke, ...)")
    common.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one param, e.g. --set budget.target=200 (repeatable; "
                             "`agent-gspo config keys` lists them)")
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = OneLineParser(prog="agent-gspo", description="Agent-GSPO: communication-efficient "
                                     "multi-agent LLM training with GSPO, as an MLOps pipeline.",
                                     epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help="one of:")

    def command(name: str, parents: list[argparse.ArgumentParser] | None = None,
                on: argparse._SubParsersAction | None = None, help_: str | None = None) -> argparse.ArgumentParser:
        return (on or sub).add_parser(name, parents=[common] if parents is None else parents,
                                      help=help_ or HELPS[name], description=help_ or HELPS[name], epilog=EXIT_CODES,
                                      formatter_class=argparse.RawDescriptionHelpFormatter)

    p = command("prepare")
    p.add_argument("--benchmarks", type=_benchmarks, default=None, help="comma list (default: data.benchmarks)")
    p.add_argument("--mirror", default=None, help="mirror folder (overrides $AGENT_GSPO_DATA_MIRROR, data.mirror)")
    p.add_argument("--out", default=None, help="output folder (default data.out_dir)")
    p.add_argument("--no-validate", action="store_true", help="skip the validation report after preparing")
    p.add_argument("--metrics", default=None, help=METRICS_HELP)

    p = command("validate")
    p.add_argument("--data", default=None, help="prepared data folder (default data.out_dir)")

    p = command("rollout")
    p.add_argument("--benchmark", required=True, choices=ALL_BENCHMARKS, help="benchmark to draw questions from")
    p.add_argument("--split", default="test", help="split of the prepared benchmark (default test)")
    p.add_argument("--limit", type=positive_int, default=8, help="questions (first N of the split)")
    p.add_argument("--agents", type=positive_int, default=None, help="agents per team (default mas.agents)")
    p.add_argument("--rounds", type=positive_int, default=None, help="communication rounds (default mas.rounds)")
    p.add_argument("--topology", default=None, choices=["complete", "chain", "star", "layered", "debate"],
                   help="who hears whom (default mas.topology)")
    p.add_argument("--group-size", type=positive_int, default=1,
                   help=f"episodes per question (--limit x --group-size <= {ROLLOUT_MAX_EPISODES})")
    p.add_argument("--seed", type=_seed, default=0, help="sampling seed (default 0)")
    p.add_argument("--silence-prior", action="store_true",
                   help="apply model.silence_prior at load, as train does at step 0 (the base model: a trained "
                        "policy has learned its own silence row)")
    p.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling at mas.temperature")
    p.add_argument("--data", default=None, help="prepared data folder (default data.out_dir)")
    p.add_argument("--json", default=None, help="write episode records (JSON lines) here")

    p = command("train")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    p.add_argument("--overwrite", action="store_true",
                   help="delete the checkpoints and outputs in --out, start over (a fresh run refuses a used folder)")
    p.add_argument("--max-steps", type=positive_int, default=None, help="stop after N steps (default gspo.steps)")
    p.add_argument("--out", default=None, help="run folder (default gspo.out_dir)")
    p.add_argument("--no-track", action="store_true", help=NO_TRACK_HELP)
    p.add_argument("--best-params", default=None, help="apply a search's best-params file (search.out_params)")
    p.add_argument("--metrics", default=None, help=METRICS_HELP + " (the per-step series is always written to "
                   "history.csv in the run folder)")

    p = command("evaluate")
    p.add_argument("--model", default=None, help="local folder, HF id, alias, or models:/<name>[/<v>|@<alias>]")
    p.add_argument("--limit", type=positive_int, default=None, help="items per benchmark (seeded sample; with "
                   "--split devset: at most this many of each benchmark's dev items)")
    p.add_argument("--split", choices=(EVAL_SPLIT, DEVSET), default=EVAL_SPLIT,
                   help=f"{EVAL_SPLIT}: the seeded sample of each test split (default); {DEVSET}: the dev items "
                   "(aqua/dev, mmlu/val, gsm8k/train; for the test-only benchmarks, test items outside the "
                   "eval.limit / eval.seed test sample), to choose recipes on (docs/data.md, 'Dev set')")
    p.add_argument("--baselines", type=_baselines, default=None,
                   help=f"comma list of {','.join(BASELINE_NAMES)} (empty string: none)")
    p.add_argument("--out", default=None, help="output folder (default eval.out_dir)")
    p.add_argument("--no-track", action="store_true", help=NO_TRACK_HELP)
    p.add_argument("--metrics", default=None, help="also write one small numbers-only JSON per system into this "
                   "folder, <system>.json (what the DVC stage tracks)")

    p = command("search")
    p.add_argument("--budget-tokens", type=int, default=None, help="stop after this many tokens (all workers)")
    p.add_argument("--trials", type=positive_int, default=None, help="trials to run (default search.trials)")
    p.add_argument("--storage", default=None, help="Optuna storage URL (sqlite:///..., postgresql+psycopg://...)")
    p.add_argument("--no-track", action="store_true", help=NO_TRACK_HELP)

    p = command("promote")
    p.add_argument("--candidate", default=None, help="models:/<name>[/<version>|@<alias>] (default: newest version)")
    p.add_argument("--limit", type=positive_int, default=None, help="items per benchmark of the compared evaluations "
                   "(default eval.limit; as given to evaluate)")
    p.add_argument("--evaluate-champion", action="store_true", help="evaluate @champion first when it has no "
                   "results under the same setting")

    command("run")

    p = command("score")
    p.add_argument("--benchmark", default=None, choices=ALL_BENCHMARKS,
                   help="benchmark the predictions answer (with --predictions)")
    p.add_argument("--predictions", default=None, help='JSON lines {"id", "prediction"} (with --benchmark)')
    p.add_argument("--items", default=None, help="an evaluation's items.jsonl: re-grade it and check the recorded "
                   "grades (instead of --benchmark/--predictions)")
    p.add_argument("--split", default="test", help="split of the prepared benchmark (default test)")
    p.add_argument("--data", default=None, help="prepared data folder (default data.out_dir)")
    p.add_argument("--out", default=None, help="per-item results (JSON lines; not the predictions file)")

    p = command("experiments", parents=[])  # forwarded before parsing (components.cli.forward_to_study)
    p.add_argument("study_args", nargs=argparse.REMAINDER, metavar="ACTION ...",
                   help="run | report | keys and their options: `python -m experiments --help` (the study, "
                        "experiments/, which this command execs)")

    p = command("config", parents=[])
    cfg_sub = p.add_subparsers(dest="config_command", required=True, metavar="ACTION", help="one of:")
    q = command("keys", on=cfg_sub, help_="every --set key with its type, default and description "
                "(from the pydantic schema)")
    q.add_argument("--section", default=None, help="only the keys of this section (gspo, budget, ...)")
    command("show", on=cfg_sub, help_="the resolved config of --profile with every --set applied, as YAML")
    return parser
