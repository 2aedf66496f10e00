"""One search worker: ``python -m components.search.worker --synthetic --storage URL``.

Multi-host pattern: start the same command on every host (or several times on one host) with
the same ``--storage`` (Postgres, ``postgresql+psycopg://user:pass@db-host/optuna``, for several
hosts; a sqlite file for processes on one host) and ``--study-name``. The workers join one
study (``load_if_exists``) and share its trial target and token / wall-clock budgets (see
:mod:`components.search.budget`); each writes the study's best parameters to ``--out-params``.

``--synthetic`` runs :class:`components.search.synthetic.SyntheticTrial` (no model needed);
``--trial-fn package.module:function`` runs any ``trial_fn(cfg, trial) -> TrialOutcome``, e.g.
the training-based one. ``--seed`` defaults to none (random draws); with a seed each trial's
draws are seeded from it and the trial number (:mod:`components.search.sampler`), so workers
given the same seed still explore different points and a lone worker is reproducible.
Prints the :class:`SearchResult` as one JSON line; exits 2 on bad input (also when the study
was created under another config), 130 on Ctrl-C and 143 on SIGTERM.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
from collections.abc import Sequence

from components.config import load_config
from components.errors import OneLineParser, run_command
from components.search.errors import SearchError
from components.search.sampler import TrialSeededSampler
from components.search.space import SearchSpace
from components.search.study import TrialFn, Worker, run_search
from components.search.synthetic import SyntheticTrial
from components.search.tracking import mlflow_tracker_factory


def _import_trial_fn(spec: str) -> TrialFn:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SearchError(f"--trial-fn {spec!r}: expected package.module:function")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise SearchError(f"--trial-fn {spec!r}: cannot import ({exc})") from exc
    if not callable(fn):
        raise SearchError(f"--trial-fn {spec!r}: {type(fn).__name__} is not callable")
    return fn  # type: ignore[no-any-return]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = OneLineParser(prog="python -m components.search.worker", description=__doc__.split("\n")[0])
    fn = p.add_mutually_exclusive_group(required=True)
    fn.add_argument("--synthetic", action="store_true", help="use the synthetic trial function")
    fn.add_argument("--trial-fn", help="package.module:function returning TrialOutcome")
    p.add_argument("--params", default=None, help="params.yaml (default $AGENT_GSPO_PARAMS or params.yaml)")
    p.add_argument("--profile", default=None)
    p.add_argument("--storage", default=None, help="Optuna storage URL (default search.storage)")
    p.add_argument("--study-name", default=None)
    p.add_argument("--trials", type=int, default=None, help="study-wide trial target")
    p.add_argument("--budget-tokens", type=int, default=None, help="study-wide token budget (0 = none)")
    p.add_argument("--budget-seconds", type=float, default=None, help="study-wide wall-clock budget (0 = none)")
    p.add_argument("--reserve-tokens", type=int, default=0, help="token reservation before any trial finished")
    p.add_argument("--out-params", default=None, help="best params YAML (default search.out_params)")
    p.add_argument("--seed", type=int, default=None, help="sampler seed, mixed with each trial number (default random)")
    p.add_argument("--sleep", type=float, default=0.0, help="synthetic: seconds each trial sleeps")
    p.add_argument("--mlflow", action="store_true", help="log to tracking.uri (parent + nested trial runs)")
    p.add_argument("--override", action="append", default=[], help="section.key=value (repeatable)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return run_command("agent-gspo search worker", lambda: _work(args))


def _work(args: argparse.Namespace) -> int:
    """The worker's search, once its flags are parsed (:func:`main` maps how it ends)."""
    cfg = load_config(args.params, args.profile, args.override)
    trial_fn: TrialFn = SyntheticTrial(args.sleep) if args.synthetic else _import_trial_fn(args.trial_fn)
    factory = None
    if args.mlflow:
        factory = mlflow_tracker_factory(cfg)
    flags = {k: v for k, v in (("trials", args.trials), ("budget_tokens", args.budget_tokens),
                               ("budget_seconds", args.budget_seconds), ("study_name", args.study_name),
                               ("out_params", args.out_params)) if v is not None and v != ""}
    study_cfg = cfg.model_copy(update={"search": cfg.search.model_copy(update=flags)})  # = --override search.<key>
    # the profile's sizes bound the space, as for `agent-gspo search` (SearchJob): both join one study
    result = run_search(study_cfg, trial_fn, space=SearchSpace.within(cfg),
                        worker=Worker(storage=args.storage, tracker_factory=factory,
                                      sampler=TrialSeededSampler(args.seed), reserve_tokens=args.reserve_tokens))
    print(json.dumps(dataclasses.asdict(result), sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
