"""The study's command line: ``python -m experiments run|report|proof-report|devchoice-report|keys`` (console script
``agent-gspo-study``; ``agent-gspo experiments ...`` execs this, without importing the study).

Same conventions as the product's CLI (:mod:`components.cli`): ``--params``, ``--profile`` and
repeatable ``--set`` on every action, bad input is one line and exit 2, Ctrl-C 130, SIGTERM 143.
Messages keep the prefix ``agent-gspo experiments``: the command users type still reaches here.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from components.cli_parser import EXIT_CODES, comma_names, positive_int
from components.config import Config, load_config
from components.config_doc import schema_keys
from components.dvc_stage import follow_dvc
from components.errors import OneLineParser, UserError, run_command
from components.io import check_output_file
from components.progress import log_to_stderr
from experiments.devchoice_report import DevChoiceInputs, build_devchoice_report
from experiments.jobs import ExperimentsJob, ReportJob
from experiments.proof_v2_report import build_proof_v2_report
from experiments.schema import ExperimentsConfig, study_section

PROG = "agent-gspo experiments"


def build_parser() -> argparse.ArgumentParser:
    common = OneLineParser(add_help=False)
    common.add_argument("--params", default=None, help="params file (default params.yaml or $AGENT_GSPO_PARAMS)")
    common.add_argument("--profile", default=None, help="profile in params.yaml (run: default experiments.profile)")
    common.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one param, e.g. --set experiments.record.b25=NAME (repeatable)")
    parser = OneLineParser(prog=PROG, description="The study (experiments/): the paper's token-economy "
                                     "experiments and their report.", epilog=EXIT_CODES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION", help="one of:")

    def action(name: str, help_: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], help=help_, description=help_, epilog=EXIT_CODES,
                              formatter_class=argparse.RawDescriptionHelpFormatter)

    q = action("run", "train / evaluate the experiments of experiments.definitions")
    q.add_argument("--only", type=comma_names, default=None, help="comma list of experiment names (default: all)")
    q.add_argument("--limit", type=positive_int, default=None, help="items per benchmark (overrides eval.limit)")
    q.add_argument("--results", default=None, help="results folder (default experiments.results_dir)")
    q.add_argument("--no-track", action="store_true", help="do not log to MLflow")
    q.add_argument("--resume", action="store_true",
                   help="a gspo experiment whose run folder holds checkpoints continues from the newest one "
                        "(same config only) instead of starting over; a baselines experiment keeps the systems "
                        "its results file holds (same config but eval.baselines, data and machine only) and "
                        "evaluates the missing ones")
    q = action("report", "regenerate the report from the results folder")
    q.add_argument("--results", default=None, help="results folder (default experiments.results_dir)")
    q.add_argument("--out", default=None, help="markdown report (default experiments.report; PNGs beside it)")
    q.add_argument("--metrics", default=None,
                   help="also write a small numbers-only metrics JSON here (what the DVC stages track)")
    q = action("proof-report", "report the proof on splitinfo2 (results/proof_v2) under a named rule version")
    q.add_argument("--results", required=True, help="folder with families*.json and runs/<name>/ (see docs)")
    q.add_argument("--out", required=True, help="markdown report (PNGs in a folder beside it)")
    q.add_argument("--rules", required=True, help="verdict rule version that judges it (v2 or later)")
    q = action("devchoice-report", "report a recipe chosen on dev items by a selection rule and its one test touch")
    q.add_argument("--dev", required=True, help="folder with the candidates' dev-set results files")
    q.add_argument("--test", required=True, help="folder for the chosen candidate's test results file")
    q.add_argument("--baselines", required=True, help="baselines results file of the same test items and settings")
    q.add_argument("--candidates", required=True, type=comma_names, help="the two candidates, in registered order: A,B")
    q.add_argument("--selection", required=True, help="selection rule version that chooses (e.g. s1)")
    q.add_argument("--rules", required=True, help="verdict rule version that judges the test touch (v2 or later)")
    q.add_argument("--out", required=True, help="markdown report (a PNG in a folder beside it)")
    action("keys", "every experiments.* key with its type, default and description (the study's schema)")
    return parser


def _report(cfg: Config, args: argparse.Namespace) -> int:
    rep = ReportJob(cfg=cfg, results=args.results, out=args.out, metrics_file=args.metrics).run()
    for c in rep.claims:
        print(f"claim ({c.key}) {c.status}: {c.title}")
    print("outputs: " + ", ".join(str(p) for p in rep.paths.values()))
    return 0


def _proof_report(cfg: Config, args: argparse.Namespace) -> int:
    """The budgeted runs' cost terms and episodes per step come from the profile (``--profile proof_v2``)."""
    check_output_file(args.out, "report (--out)")
    verdicts = build_proof_v2_report(Path(args.results), Path(args.out), args.rules,
                                     (cfg.reward.token_norm, cfg.reward.lambda_turn),
                                     cfg.gspo.questions_per_step * cfg.gspo.group_size)
    for name, ok in verdicts.items():
        print(f"{name}: {'PASS' if ok else 'FAIL'}")
    print(f"outputs: {args.out}")
    return 0


def _devchoice_report(cfg: Config, args: argparse.Namespace) -> int:
    if len(args.candidates) != 2:
        raise UserError(f"--candidates: name exactly two candidates, A,B (got {len(args.candidates)})")
    check_output_file(args.out, "report (--out)")
    command = (f"python -m experiments devchoice-report --dev {args.dev} --test {args.test} "
               f"--baselines {args.baselines} --candidates {','.join(args.candidates)} "
               f"--selection {args.selection} --rules {args.rules} --out {args.out}")
    inputs = DevChoiceInputs(Path(args.dev), Path(args.test), Path(args.baselines),
                             (args.candidates[0], args.candidates[1]), args.selection, args.rules)
    preds = build_devchoice_report(inputs, Path(args.out), command)
    for name, ok in preds.items():
        print(f"{name}: {'n/a' if ok is None else ('holds' if ok else 'wrong')}")
    print(f"outputs: {args.out}")
    return 0


def _run(cfg: Config, args: argparse.Namespace) -> int:
    """Without --profile (and $AGENT_GSPO_PROFILE) the runs use ``experiments.profile`` (the results
    profile), not the 200-step default."""
    if args.profile is None and not os.environ.get("AGENT_GSPO_PROFILE"):
        cfg = load_config(args.params, study_section(cfg).profile, args.overrides)
    outcomes = ExperimentsJob(cfg=cfg, only=args.only, limit=args.limit, results_dir=args.results,
                              user_overrides=list(args.overrides), track=not args.no_track, params=args.params,
                              resume=args.resume).run()
    for o in outcomes:
        if o.results.kind == "proof":
            c = {s: next(iter(cells.values())) for s, cells in o.results.eval.items()}
            print(f"{o.name}: {o.path}; " + ", ".join(f"{s} accuracy {x.accuracy:.3f} / {x.tokens_total_mean:.0f} "
                                                     "tokens per episode" for s, x in c.items())
                  + f"; {o.results.wall_seconds:.0f} s")
            continue
        s = o.results.summary
        main_system = next((m for m in ("agent_gspo", "mas_untrained") if m in s), next(iter(s)))
        print(f"{o.name}: {o.path}; {main_system} accuracy {s[main_system]['accuracy']:.3f}, "
              f"tokens {s[main_system]['tokens_total']}, {o.results.wall_seconds:.0f} s")
    return 0


def _keys(cfg: Config, args: argparse.Namespace) -> int:
    study_section(cfg)  # the params file's section must validate before its keys are listed
    for doc in schema_keys(ExperimentsConfig, "experiments."):
        print(f"{doc.key}  ({doc.type}, default {doc.default!r}): {doc.description}")
    return 0


ACTIONS = {"run": _run, "report": _report, "proof-report": _proof_report, "devchoice-report": _devchoice_report,
           "keys": _keys}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    empty = [name for name, value in vars(args).items()  # a path or name "" would mean its default
             if isinstance(value, str) and not value.strip() and name != "profile"]
    if empty:
        print(f"{PROG} {args.action}: error: --{empty[0].replace('_', '-')}: empty path or name "
              "(omit the option for its default)", file=sys.stderr)
        return 2
    log_to_stderr()

    def command() -> int:
        follow_dvc()  # a DVC stage stops when the `dvc` running it is killed (it does not pass SIGTERM on)
        cfg = load_config(args.params, args.profile, args.overrides)
        if getattr(args, "metrics", None):  # checked before the work, not after it (exit 2)
            check_output_file(args.metrics, "metrics file (--metrics)")
        return ACTIONS[args.action](cfg, args)

    return run_command(PROG, command)
