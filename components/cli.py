"""`agent-gspo` command line: every pipeline step, running the same jobs as the flows and DVC.

Each subcommand lives in a small ``_cmd_*`` function that builds a job (:mod:`components.jobs`)
from its flags and prints the job's result: the parser below owns the flags,
:func:`load_config` owns validation. Bad input (a :class:`UserError`) prints one clear message
and exits 2; anything else is a bug and keeps its traceback.

Imports: this entry point is the project's one exception to "the project's modules at module
level": its dispatch stays lazy, so that ``agent-gspo --help`` and ``agent-gspo config keys``
(about 0.3 s) load none of torch, MLflow, Prefect, optuna, scipy or pyarrow. The jobs are reached
through :mod:`components.jobs`, whose names load on first use (a job module imports what its
command needs at its own module level); the few imports left inside a command say what they
defer. tests/integration/test_module_level_imports.py allowlists this file for that reason and checks
that ``--help`` stays light.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from components import jobs
from components.cli_parser import build_parser
from components.config import Config, ConfigError, load_config
from components.config_doc import format_keys, resolved_yaml
from components.dvc_stage import follow_dvc
from components.errors import UserError, run_command
from components.io import check_output_file
from components.jobs.base import ConfigSource
from components.progress import log_to_stderr


def _source(args: argparse.Namespace) -> ConfigSource:
    return ConfigSource(params=args.params, profile=args.profile, overrides=tuple(args.overrides))


def _cmd_prepare(cfg: Config, args: argparse.Namespace) -> int:
    job = jobs.PrepareJob(cfg=cfg, benchmarks=args.benchmarks, mirror=args.mirror, out_dir=args.out,
                     validate_after=not args.no_validate, metrics_file=args.metrics)
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
    _print_validation(jobs.ValidateJob(cfg=cfg, data_dir=args.data).run())
    return 0


def _cmd_score(cfg: Config, args: argparse.Namespace) -> int:
    """Grade a predictions file with the limits evaluation uses (``eval.code_timeout_s`` bounds each
    program and maths check, as in :mod:`components.evaluation.runner`), and print the summary
    with only the first few missing ids: a one-line file against GSM8K would otherwise print 1318
    of them (``n_missing`` counts them all)."""
    from components.data.prepare import load_split  # lazy: pyarrow (~0.5 s)
    from components.evaluation.items import regrade_file  # lazy: scipy (~2.4 s, via the items' comparison)
    from components.scoring import score_predictions_file  # lazy: the graders' multiprocessing (~20 ms)
    from components.scoring.sandbox import hide_paths

    shown_missing = 10
    data_dir = Path(args.data or cfg.data.out_dir)
    hide_paths(cfg.data.mirror, cfg.data.out_dir, data_dir)  # gold answers, wherever they were put
    if args.items:  # re-grade an evaluation's per-item record; exit 2 when a grade differs from it
        print(json.dumps(regrade_file(args.items, data_dir, split=args.split, out=args.out,
                                      timeout_s=cfg.eval.code_timeout_s), indent=2))
        return 0
    if not args.benchmark or not args.predictions:
        raise UserError("score: give --benchmark and --predictions, or --items <evaluation folder>/items.jsonl")
    records = load_split(data_dir, args.benchmark, args.split, cfg.data)
    summary = score_predictions_file(records, Path(args.predictions), Path(args.out) if args.out else None,
                                     timeout_s=cfg.eval.code_timeout_s,
                                     protected=(data_dir, cfg.data.out_dir, cfg.data.mirror))
    summary["missing_ids"] = summary["missing_ids"][:shown_missing]
    print(json.dumps(summary, indent=2))
    return 0


def _cmd_rollout(cfg: Config, args: argparse.Namespace) -> int:
    result = jobs.RolloutJob(cfg=cfg, benchmark=args.benchmark, split=args.split, limit=args.limit,
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
    source = _source(args)
    if args.best_params:
        from components.search import load_best_params  # lazy: the search package imports optuna (~3 s)

        source = source.plus(load_best_params(args.best_params))
        try:
            cfg = source.load()
        except ConfigError as exc:  # the config without the file loaded: the file's values are what is wrong
            raise ConfigError(f"--best-params {args.best_params}: a value does not fit: {exc}") from exc
    if args.resume and args.overwrite:
        raise UserError("--resume and --overwrite exclude each other")
    jobs.TrainJob(cfg=cfg, source=source, resume=args.resume, overwrite=args.overwrite, max_steps=args.max_steps,
             out_dir=args.out, track=not args.no_track, metrics_file=args.metrics).run()
    return 0


def _cmd_evaluate(cfg: Config, args: argparse.Namespace) -> int:
    result = jobs.EvaluateJob(cfg=cfg, model=args.model, limit=args.limit, baselines=args.baselines, out_dir=args.out,
                         split=args.split, track=not args.no_track, metrics_file=args.metrics).run()
    print(result.report.markdown)
    print("outputs: " + ", ".join(str(p) for p in result.report.paths.values()))
    where = f"; recorded on {result.version.uri}" if result.version else ""
    print(f"setting {result.setting.key()} ({result.setting.describe()}); run {result.run_id}{where}")
    return 0


def _cmd_promote(cfg: Config, args: argparse.Namespace) -> int:
    decision = jobs.PromoteJob(cfg=cfg, candidate=args.candidate, limit=args.limit,
                          evaluate_champion=args.evaluate_champion).run()
    print(decision.block())
    return 0


def _cmd_search(cfg: Config, args: argparse.Namespace) -> int:
    result = jobs.SearchJob(cfg=cfg, trials=args.trials, budget_tokens=args.budget_tokens, storage=args.storage,
                       track=not args.no_track).run()
    print(f"search: {result.n_complete} trial(s) complete, stopped by {result.stopped_by}, "
          f"{result.tokens_spent} tokens spent; best dev accuracy {result.best_dev_accuracy} at "
          f"{result.best_mean_tokens_per_episode} tokens/episode (feasible: {result.best_feasible})")
    if result.written:
        print(f"best parameters: {result.params_path}  ({' '.join(result.best_overrides)})")
    else:
        print(f"best parameters: {result.params_path} unchanged ({result.verdict})")
    return 0


def _cmd_run(cfg: Config, args: argparse.Namespace) -> int:
    from flows.local_server import prefect_api  # lazy: loads libc (ctypes) at import, for `run` only
    from flows.pipeline import run_pipeline  # lazy: Prefect and torch, for `run` only (module docstring)

    with prefect_api():  # a temporary server that a terminal's Ctrl-C does not kill before the flow ends
        summary = run_pipeline(cfg.profile, args.params, list(args.overrides))  # no password in Prefect's db
    print(json.dumps(summary, indent=2, default=str))
    return 0


def forward_to_study(argv: Sequence[str]) -> NoReturn:
    """``agent-gspo experiments ARGS`` becomes ``python -m experiments ARGS`` (the study, ``experiments/``)
    in this process's place: the product never imports the study (an import-linter contract), yet the
    command users and old scripts type keeps working, with the same exit codes and signals (exec, not a
    child: a DVC stage or a Ctrl-C stops the study itself). The checkout root goes first on
    ``PYTHONPATH`` so the study is found beside ``components/`` wherever the command runs from."""
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "experiments", *argv], env)


def _cmd_experiments(cfg: Config, args: argparse.Namespace) -> int:
    """Reached only when :func:`main` was not given its argv by name (it forwards ``experiments``
    before parsing)."""
    forward_to_study(args.study_args)


def _cmd_config(cfg: Config, args: argparse.Namespace) -> int:
    """`config keys`: every --set key (type, default, description, from the schema); `config show`:
    the resolved config of --profile with every --set applied (what a command with them would use)."""
    print(format_keys(cfg, args.section) if args.config_command == "keys" else resolved_yaml(cfg), end="\n")
    return 0


COMMANDS: dict[str, Callable[[Config, argparse.Namespace], int]] = {
    "prepare": _cmd_prepare, "validate": _cmd_validate, "rollout": _cmd_rollout, "train": _cmd_train,
    "evaluate": _cmd_evaluate, "search": _cmd_search, "promote": _cmd_promote, "run": _cmd_run,
    "score": _cmd_score, "experiments": _cmd_experiments, "config": _cmd_config,
}
"""each command's function; its flags and help are in :mod:`components.cli_parser`"""


def _log_progress(command: str) -> None:
    """Progress lines of the library (``components.*`` loggers, INFO) on stderr. Not for ``run``:
    there Prefect shows them (see flows/logs.py), and twice would be noise."""
    if command != "run":
        log_to_stderr()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["experiments"]:  # the study's own command line parses, validates and runs it
        forward_to_study(argv[1:])
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
        if getattr(args, "metrics", None) and args.command != "evaluate":  # checked before the work, not
            check_output_file(args.metrics, "metrics file (--metrics)")  # after it (exit 2); evaluate's is a
            # folder (EvaluateJob)
        return COMMANDS[args.command](cfg, args)

    return run_command(f"agent-gspo {args.command}", command, resumable=args.command == "train")


if __name__ == "__main__":
    sys.exit(main())
