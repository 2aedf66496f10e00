"""`agent-gspo` command line: every pipeline step, running the same jobs as the flows and DVC.

Each subcommand lives in a small ``_cmd_*`` function that builds a job (:mod:`components.jobs`)
from its flags and prints the job's result: the parser below owns the flags,
:func:`load_config` owns validation. Bad input (a :class:`UserError`) prints one clear message
and exits 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from components.config import ALL_BENCHMARKS, BASELINE_NAMES, Config, load_config
from components.dvc_stage import follow_dvc
from components.errors import UserError, run_command
from components.jobs.base import ConfigSource
from components.jobs.rollout import ROLLOUT_MAX_EPISODES


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _positive(text: str) -> int:
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


def _names(text: str) -> list[str]:
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
    return _known(_names(text), ALL_BENCHMARKS, "benchmark")


def _baselines(text: str) -> list[str]:
    """``--baselines``: checked by name before any model loads (an empty string: none)."""
    return _known(_csv(text), BASELINE_NAMES, "baseline")


def _source(args: argparse.Namespace) -> ConfigSource:
    return ConfigSource(params=args.params, profile=args.profile, overrides=tuple(args.overrides))


def _cmd_prepare(cfg: Config, args: argparse.Namespace) -> int:
    from components.jobs import PrepareJob

    job = PrepareJob(cfg=cfg, benchmarks=args.benchmarks, mirror=args.mirror, out_dir=args.out,
                     validate_after=not args.no_validate, progress=sys.stdout.isatty(), metrics_file=args.metrics)
    result = job.run()
    report = result.report
    print(f"prepared {len(report.results)} benchmark(s) into {job.out} in {report.seconds:.1f} s")
    for r in report.results:
        rows = ", ".join(f"{split} {n}" for split, n in r.splits.items())
        print(f"  {r.name:<11} {rows:<34} source {r.source}")
    print(f"manifest: {report.manifest_path}")
    if result.validation is not None:
        _print_validation(result.validation)
    return 0


def _print_validation(report) -> None:
    n = len(report.results)
    print(f"validation: {n}/{n} suites passed (great-expectations); report {report.path}")


def _cmd_validate(cfg: Config, args: argparse.Namespace) -> int:
    from components.jobs import ValidateJob

    _print_validation(ValidateJob(cfg=cfg, data_dir=args.data).run())
    return 0


def _cmd_score(cfg: Config, args: argparse.Namespace) -> int:
    """Grade a predictions file with the limits evaluation uses (``eval.code_timeout_s`` bounds each
    program and maths check, as in :mod:`components.evaluation.runner`), and print the summary
    with only the first few missing ids: a one-line file against GSM8K would otherwise print 1318
    of them (``n_missing`` counts them all)."""
    from components.data.prepare import load_split
    from components.scoring import score_predictions_file
    from components.scoring.sandbox import hide_paths

    shown_missing = 10
    data_dir = Path(args.data or cfg.data.out_dir)
    hide_paths(cfg.data.mirror, cfg.data.out_dir, data_dir)  # gold answers, wherever they were put
    records = load_split(data_dir, args.benchmark, args.split)
    summary = score_predictions_file(records, Path(args.predictions), Path(args.out) if args.out else None,
                                     timeout_s=cfg.eval.code_timeout_s,
                                     protected=(data_dir, cfg.data.out_dir, cfg.data.mirror))
    summary["missing_ids"] = summary["missing_ids"][:shown_missing]
    print(json.dumps(summary, indent=2))
    return 0


def _cmd_rollout(cfg: Config, args: argparse.Namespace) -> int:
    from components.jobs import RolloutJob

    result = RolloutJob(cfg=cfg, benchmark=args.benchmark, split=args.split, limit=args.limit,
                        group_size=args.group_size, agents=args.agents, rounds=args.rounds, topology=args.topology,
                        seed=args.seed, greedy=args.greedy, silence_prior=args.silence_prior, data=args.data,
                        json_out=args.json).run()
    for transcript in result.transcripts:
        print(transcript)
        print()
    print(json.dumps(result.summary, indent=2))
    if result.json_path:
        print(f"episode records: {result.json_path}")
    return 0


def _cmd_train(cfg: Config, args: argparse.Namespace) -> int:
    from components.jobs import TrainJob

    source = _source(args)
    if args.best_params:
        from components.search import load_best_params

        source = source.plus(load_best_params(args.best_params))
        cfg = source.load()
    if args.resume and args.overwrite:
        raise UserError("--resume and --overwrite exclude each other")
    TrainJob(cfg=cfg, source=source, resume=args.resume, overwrite=args.overwrite, max_steps=args.max_steps,
             out_dir=args.out, track=not args.no_track, metrics_file=args.metrics).run()
    return 0


def _cmd_evaluate(cfg: Config, args: argparse.Namespace) -> int:
    from components.jobs import EvaluateJob

    result = EvaluateJob(cfg=cfg, model=args.model, limit=args.limit, baselines=args.baselines, out_dir=args.out,
                         track=not args.no_track, metrics_file=args.metrics).run()
    print(result.report.markdown)
    print("outputs: " + ", ".join(str(p) for p in result.report.paths.values()))
    where = f"; recorded on {result.version.uri}" if result.version else ""
    print(f"setting {result.setting.key()} ({result.setting.describe()}); run {result.run_id}{where}")
    return 0


def _cmd_promote(cfg: Config, args: argparse.Namespace) -> int:
    from components.jobs import PromoteJob

    decision = PromoteJob(cfg=cfg, candidate=args.candidate, limit=args.limit,
                          evaluate_champion=args.evaluate_champion).run()
    print(f"{decision.name} v{decision.version}: {decision.decision} ({decision.reason})")
    print(json.dumps(decision.metrics_used, indent=2, default=str))
    return 0


def _cmd_search(cfg: Config, args: argparse.Namespace) -> int:
    from components.jobs import SearchJob

    result = SearchJob(cfg=cfg, trials=args.trials, budget_tokens=args.budget_tokens, storage=args.storage,
                       track=not args.no_track).run()
    print(f"search: {result.n_complete} trial(s) complete, stopped by {result.stopped_by}, "
          f"{result.tokens_spent} tokens spent; best dev accuracy {result.best_dev_accuracy} at "
          f"{result.best_mean_tokens_per_episode} tokens/episode (feasible: {result.best_feasible})")
    print(f"best parameters: {result.params_path}  ({' '.join(result.best_overrides)})")
    return 0


def _cmd_run(cfg: Config, args: argparse.Namespace) -> int:
    from flows.local_server import prefect_api
    from flows.pipeline import run_pipeline

    with prefect_api():  # a temporary server that a terminal's Ctrl-C does not kill before the flow ends
        summary = run_pipeline(cfg.profile, args.params, list(args.overrides))  # no password in Prefect's db
    print(json.dumps(summary, indent=2, default=str))
    return 0


def _cmd_experiments(cfg: Config, args: argparse.Namespace) -> int:
    """`experiments run` / `experiments report`: without --profile (and $AGENT_GSPO_PROFILE) the
    runs use ``experiments.profile`` (the results profile), not the 200-step default."""
    import os

    from components.jobs import ExperimentsJob, ReportJob

    if args.experiments_command == "report":
        rep = ReportJob(cfg=cfg, results=args.results, out=args.out, metrics_file=args.metrics).run()
        for c in rep.claims:
            print(f"claim ({c.key}) {c.status}: {c.title}")
        print("outputs: " + ", ".join(str(p) for p in rep.paths.values()))
        return 0
    if args.profile is None and not os.environ.get("AGENT_GSPO_PROFILE"):
        cfg = load_config(args.params, cfg.experiments.profile, args.overrides)
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
        main = next((m for m in ("agent_gspo", "mas_untrained") if m in s), next(iter(s)))
        print(f"{o.name}: {o.path}; {main} accuracy {s[main]['accuracy']:.3f}, "
              f"tokens {s[main]['tokens_total']}, {o.results.wall_seconds:.0f} s")
    return 0


COMMANDS: dict[str, tuple[str, Callable[[Config, argparse.Namespace], int]]] = {
    "prepare": ("prepare benchmarks into normalised parquet (mirror > hub > package)", _cmd_prepare),
    "validate": ("validate prepared data with great-expectations", _cmd_validate),
    "rollout": ("run multi-agent episodes and print transcripts", _cmd_rollout),
    "train": ("GSPO training (in-process, or under torchrun / deepspeed per deepspeed.launcher)", _cmd_train),
    "evaluate": ("evaluate a policy and the baselines on the seven benchmarks", _cmd_evaluate),
    "search": ("budget-constrained hyper-parameter search (Optuna)", _cmd_search),
    "promote": ("gate a registered version against @champion (accuracy AND tokens)", _cmd_promote),
    "run": ("the whole pipeline as one Prefect flow", _cmd_run),
    "score": ("score a JSON-lines predictions file against a benchmark", _cmd_score),
    "experiments": ("reproduce the paper's token-economy claims (run) and regenerate docs/results.md (report)",
                    _cmd_experiments),
}


METRICS_HELP = "also write a small numbers-only metrics JSON here (what the DVC stages track)"


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--params", default=None, help="params file (default params.yaml or $AGENT_GSPO_PARAMS)")
    common.add_argument("--profile", default=None, help="profile in params.yaml (default, smoke, ...)")
    common.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one param, e.g. --set budget.target=200 (repeatable)")
    parser = argparse.ArgumentParser(prog="agent-gspo", description="Agent-GSPO: communication-efficient "
                                     "multi-agent LLM training with GSPO, as an MLOps pipeline.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    helps = {name: help_ for name, (help_, _) in COMMANDS.items()}

    p = sub.add_parser("prepare", parents=[common], help=helps["prepare"])
    p.add_argument("--benchmarks", type=_benchmarks, default=None, help="comma list (default: data.benchmarks)")
    p.add_argument("--mirror", default=None, help="mirror folder (overrides $AGENT_GSPO_DATA_MIRROR, data.mirror)")
    p.add_argument("--out", default=None, help="output folder (default data.out_dir)")
    p.add_argument("--no-validate", action="store_true", help="skip the validation report after preparing")
    p.add_argument("--metrics", default=None, help=METRICS_HELP)

    p = sub.add_parser("validate", parents=[common], help=helps["validate"])
    p.add_argument("--data", default=None, help="prepared data folder (default data.out_dir)")

    p = sub.add_parser("rollout", parents=[common], help=helps["rollout"])
    p.add_argument("--benchmark", required=True, choices=ALL_BENCHMARKS)
    p.add_argument("--split", default="test")
    p.add_argument("--limit", type=_positive, default=8, help="questions (first N of the split)")
    p.add_argument("--agents", type=_positive, default=None)
    p.add_argument("--rounds", type=_positive, default=None)
    p.add_argument("--topology", default=None, choices=["complete", "chain", "star", "layered", "debate"])
    p.add_argument("--group-size", type=_positive, default=1,
                   help=f"episodes per question (--limit x --group-size <= {ROLLOUT_MAX_EPISODES})")
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument("--silence-prior", action="store_true",
                   help="apply model.silence_prior at load, as train does at step 0 (the base model: a trained "
                        "policy has learned its own silence row)")
    p.add_argument("--greedy", action="store_true")
    p.add_argument("--data", default=None)
    p.add_argument("--json", default=None, help="write episode records (JSON lines) here")

    p = sub.add_parser("train", parents=[common], help=helps["train"])
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    p.add_argument("--overwrite", action="store_true",
                   help="delete the checkpoints and outputs in --out, start over (a fresh run refuses a used folder)")
    p.add_argument("--max-steps", type=_positive, default=None, help="stop after N steps (default gspo.steps)")
    p.add_argument("--out", default=None, help="run folder (default gspo.out_dir)")
    p.add_argument("--no-track", action="store_true", help="do not log to MLflow")
    p.add_argument("--best-params", default=None, help="apply a search's best-params file (search.out_params)")
    p.add_argument("--metrics", default=None, help=METRICS_HELP)

    p = sub.add_parser("evaluate", parents=[common], help=helps["evaluate"])
    p.add_argument("--model", default=None, help="local folder, HF id, alias, or models:/<name>[/<v>|@<alias>]")
    p.add_argument("--limit", type=_positive, default=None, help="items per benchmark (seeded sample)")
    p.add_argument("--baselines", type=_baselines, default=None,
                   help=f"comma list of {','.join(BASELINE_NAMES)} (empty string: none)")
    p.add_argument("--out", default=None, help="output folder (default eval.out_dir)")
    p.add_argument("--no-track", action="store_true", help="do not log to MLflow")
    p.add_argument("--metrics", default=None, help=METRICS_HELP)

    p = sub.add_parser("search", parents=[common], help=helps["search"])
    p.add_argument("--budget-tokens", type=int, default=None, help="stop after this many tokens (all workers)")
    p.add_argument("--trials", type=_positive, default=None)
    p.add_argument("--storage", default=None, help="Optuna storage URL (sqlite:///..., postgresql+psycopg://...)")
    p.add_argument("--no-track", action="store_true", help="do not log to MLflow")

    p = sub.add_parser("promote", parents=[common], help=helps["promote"])
    p.add_argument("--candidate", default=None, help="models:/<name>[/<version>|@<alias>] (default: newest version)")
    p.add_argument("--limit", type=_positive, default=None, help="items per benchmark of the compared evaluations "
                   "(default eval.limit; as given to evaluate)")
    p.add_argument("--evaluate-champion", action="store_true", help="evaluate @champion first when it has no "
                   "results under the same setting")

    sub.add_parser("run", parents=[common], help=helps["run"])

    p = sub.add_parser("score", parents=[common], help=helps["score"])
    p.add_argument("--benchmark", required=True, choices=ALL_BENCHMARKS)
    p.add_argument("--predictions", required=True, help='JSON lines {"id", "prediction"}')
    p.add_argument("--split", default="test")
    p.add_argument("--data", default=None, help="prepared data folder (default data.out_dir)")
    p.add_argument("--out", default=None, help="per-item results (JSON lines; not the predictions file)")

    p = sub.add_parser("experiments", help=helps["experiments"])
    exp_sub = p.add_subparsers(dest="experiments_command", required=True, metavar="ACTION")
    q = exp_sub.add_parser("run", parents=[common], help="train / evaluate the experiments of experiments.definitions")
    q.add_argument("--only", type=_names, default=None, help="comma list of experiment names (default: all)")
    q.add_argument("--limit", type=_positive, default=None, help="items per benchmark (overrides eval.limit)")
    q.add_argument("--results", default=None, help="results folder (default experiments.results_dir)")
    q.add_argument("--no-track", action="store_true", help="do not log to MLflow")
    q.add_argument("--resume", action="store_true",
                   help="a gspo experiment whose run folder holds checkpoints continues from the newest one "
                        "(same config only) instead of starting over; a baselines experiment keeps the systems "
                        "its results file holds (same config but eval.baselines, data and machine only) and "
                        "evaluates the missing ones")
    q = exp_sub.add_parser("report", parents=[common], help="regenerate the report from the results folder")
    q.add_argument("--results", default=None, help="results folder (default experiments.results_dir)")
    q.add_argument("--out", default=None, help="markdown report (default experiments.report; PNGs beside it)")
    q.add_argument("--metrics", default=None, help=METRICS_HELP)
    return parser


def _log_progress(command: str) -> None:
    """Progress lines of the library (``components.*`` loggers, INFO) on stderr. Not for ``run``:
    there Prefect shows them (see flows/logs.py), and twice would be noise."""

    if command == "run":
        return
    logger = logging.getLogger("components")
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):  # main() may run many times in one process
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


class _StderrHandler(logging.StreamHandler):
    """A handler on whatever ``sys.stderr`` is when a record is written, not the one at setup: a
    caller that swaps stderr (a test's capture, a wrapper) and closes it later would otherwise get
    "--- Logging error ---" tracebacks from every later progress line."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    empty = [name for name, value in vars(args).items()  # every string option is a path or a name: "" would
             if isinstance(value, str) and not value.strip() and name != "profile"]  # mean its default
    if empty:  # (--profile "" has its own message)
        print(f"agent-gspo {args.command}: error: --{empty[0].replace('_', '-')}: empty path or name "
              "(omit the option for its default)", file=sys.stderr)
        return 2
    _log_progress(args.command)

    def command() -> int:
        follow_dvc()  # a DVC stage stops when the `dvc` running it is killed (it does not pass SIGTERM on)
        cfg = load_config(args.params, args.profile, args.overrides)
        if getattr(args, "metrics", None):  # checked before the work, not after it (exit 2, no traceback)
            from components.io import check_output_file

            check_output_file(args.metrics, "metrics file (--metrics)")
        return COMMANDS[args.command][1](cfg, args)

    return run_command(f"agent-gspo {args.command}", command, resumable=args.command == "train")


if __name__ == "__main__":
    sys.exit(main())
