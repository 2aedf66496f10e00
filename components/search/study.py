"""Budget-constrained hyper-parameter search: maximise dev accuracy subject to a token limit.

Constraint API (Optuna 5): the objective records ``c = mean tokens per episode -
search.max_tokens_per_episode`` with ``trial.set_constraint("tokens_per_episode", c)``.
``TPESampler(constraints_func=...)`` is deprecated since Optuna 5.0 (FutureWarning, removal
planned for 7.0) and tied the constraint to one sampler instance; ``Trial.set_constraint``
stores it in the trial's system attrs (``constraints:<key>``), where ``FrozenTrial.constraints``,
the constraint-aware samplers (TPE, GP, NSGA-II/III, CMA-ES) and ``Study.best_trial`` read it,
whichever worker or sampler looks at the study. Feasible means ``c <= 0``.

Budgets and the trial target are study-wide (see :mod:`components.search.budget` for the
admission rule and its guarantees), so several workers -- processes or hosts sharing one
storage -- together run ``trials`` trials and stay within ``budget_tokens``/``budget_seconds``.
A trial counts toward ``trials`` once it COMPLETEs (or while it runs): a failed or interrupted
trial is replaced, and a study gives up after ``trials`` failed trials (``stopped_by="failures"``).
Each trial samples with its own seed, derived from ``gspo.seed`` and its trial number
(:mod:`components.search.sampler`), so concurrent workers and resumed runs explore new points
while a lone fresh run is reproducible. A study records the config its trials ran under and
refuses a worker with another (:mod:`components.search.study_config`).
Storage: ``sqlite:///file.db`` (default, one host) or ``postgresql+psycopg://user@host/db``
(several hosts); the study is opened with ``load_if_exists=True``, so the same command
started on every host joins one study (``python -m components.search.worker``). A rerun of a
finished study therefore runs no new trial: use a new ``search.study_name`` for a fresh search
(``budget_seconds`` likewise counts from the study's first start, gaps between resumes included), as
every scheduled flow run does (``<study_name>-<run folder>``, ``flows/run_folders.py``).
An exception raised by ``trial_fn`` (an OOM, a tracking error, a bad outcome) fails that trial
(Optuna state FAIL, the error in its ``search:error`` user attribute) and the worker goes on
with the next one; only a budget refusal (or the failure cap) stops it. A failed trial is charged
its token reservation. A tracking error while logging a finished trial's metrics does not fail the
trial. Ctrl-C or SIGTERM during a trial marks it ``search:interrupted`` (Optuna state FAIL, not
counted) and propagates, without Optuna's failure warning and traceback: the caller
(:func:`components.errors.run_command`) prints the one line.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NoReturn

import optuna
from optuna.trial import FrozenTrial, TrialState

from components.config import Config
from components.errors import Terminated
from components.progress import leaf
from components.redact import redact as redact_text
from components.search import budget as B
from components.search import candidate, study_config
from components.search.errors import SearchError
from components.search.outcome import SearchResult, TrialFn, TrialOutcome, Worker
from components.search.params_file import write_best_params
from components.search.sampler import TrialSeededSampler
from components.search.space import SearchSpace, apply_overrides
from components.search.storage import close_storage, open_study, redact
from components.search.tracking import ParentRun, log_search_metrics
from components.tracking.errors import TrackingError

log = logging.getLogger(__name__)

ATTR_ERROR = B.ATTR_ERROR
"""user attribute of a failed trial: the exception, type and message (URI passwords redacted)"""
OPTUNA_TRIAL_LOGGER = "optuna.study._optimize"
"""Optuna's logger of "Trial N failed ..." warnings (:class:`_QuietInterrupts` filters it)"""


class _Refused(Exception):
    """Raised inside the objective when the budget was used up between the check and ``ask``."""


class _QuietInterrupts(logging.Filter):
    """Drops Optuna's ``Trial N failed ... KeyboardInterrupt()`` warning (with its traceback) and the
    ``Trial N failed with value None.`` that follows, for the trials an interrupt ended.

    Why: Ctrl-C and SIGTERM are the user's request, not a failure; :func:`components.errors.run_command`
    prints the one line that says so. Failures of other trials keep Optuna's warning."""

    def __init__(self) -> None:
        super().__init__()
        self.numbers: set[int] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.numbers:
            return True
        message = record.getMessage()
        return not any(message.startswith(f"Trial {n} failed") for n in self.numbers)


@contextlib.contextmanager
def _quiet_interrupts() -> Iterator[_QuietInterrupts]:
    quiet = _QuietInterrupts()
    logger = logging.getLogger(OPTUNA_TRIAL_LOGGER)
    logger.addFilter(quiet)
    try:
        yield quiet
    finally:
        logger.removeFilter(quiet)


@contextlib.contextmanager
def _optuna_warnings_only() -> Iterator[None]:
    """Optuna's own "Trial N finished with value ..." INFO line repeated the project's "trial i/n done"
    line for every trial; its warnings (a failed trial) stay."""
    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(before)


def _check_outcome(outcome: object, number: int) -> TrialOutcome:
    where = f"trial {number}: trial_fn returned"
    if not isinstance(outcome, TrialOutcome):
        raise SearchError(f"{where} {type(outcome).__name__}, expected TrialOutcome")
    if not (math.isfinite(outcome.dev_accuracy) and 0.0 <= outcome.dev_accuracy <= 1.0):
        raise SearchError(f"{where} dev_accuracy={outcome.dev_accuracy!r}, expected a number in [0, 1]")
    if not (math.isfinite(outcome.mean_tokens_per_episode) and outcome.mean_tokens_per_episode >= 0):
        raise SearchError(f"{where} mean_tokens_per_episode={outcome.mean_tokens_per_episode!r}, expected >= 0")
    if outcome.tokens_spent < 0 or not (math.isfinite(outcome.seconds) and outcome.seconds >= 0):
        raise SearchError(f"{where} tokens_spent={outcome.tokens_spent!r}, seconds={outcome.seconds!r}; "
                          f"both must be >= 0")
    return outcome


def select_best(trials: list[FrozenTrial]) -> FrozenTrial | None:
    """Highest accuracy among feasible COMPLETE trials (ties: fewer tokens, then earlier trial);
    if none is feasible, the least-violating one (ties: higher accuracy)."""
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
    if not done:
        return None

    def violation(t: FrozenTrial) -> float:
        return sum(max(0.0, v) for v in t.constraints.values())

    def tokens(t: FrozenTrial) -> float:
        return float(t.user_attrs.get(B.ATTR_MEAN_TOKENS, math.inf))

    feasible = [t for t in done if violation(t) == 0.0]
    if feasible:
        return min(feasible, key=lambda t: (-float(t.value), tokens(t), t.number))  # type: ignore[arg-type]
    return min(done, key=lambda t: (violation(t), -float(t.value), t.number))  # type: ignore[arg-type]


def run_search(cfg: Config, trial_fn: TrialFn, *, space: SearchSpace | None = None,
               worker: Worker | None = None) -> SearchResult:
    """Run (or join) the study; write the best feasible parameters to ``cfg.search.out_params`` only
    when they beat the profile's own beyond noise (:mod:`components.search.candidate`).

    The study's bookkeeping is ``cfg.search``: ``trials``, ``budget_tokens``, ``budget_seconds``
    (0 = no limit), ``storage`` (unless ``worker.storage``), ``study_name``, ``out_params`` (these
    keys are left out of the study's config hash, :mod:`components.search.study_config`).
    ``trial_fn(trial_cfg, trial)`` gets ``cfg`` with the trial's overrides applied; ``space``
    defaults to :class:`SearchSpace`; ``worker``: see :class:`Worker`.
    Raises :class:`components.search.study_config.ConfigMismatchError` (a :class:`SearchError`)
    when the study was created under another config.
    """
    worker = worker or Worker()
    storage, tracker_factory, sampler, reserve_tokens = (worker.storage, worker.tracker_factory, worker.sampler,
                                                         worker.reserve_tokens)
    s = cfg.search
    n_trials, tok, sec = s.trials, s.budget_tokens, s.budget_seconds
    if n_trials < 1 or tok < 0 or sec < 0 or reserve_tokens < 0:
        raise SearchError(f"search: trials must be >= 1 and budgets >= 0 (got trials={n_trials}, "
                          f"budget_tokens={tok}, budget_seconds={sec}, reserve_tokens={reserve_tokens})")
    # failures: cap them, since a failed trial does not count toward `trials` (see budget.py)
    limits = B.Budget(trials=n_trials, tokens=tok or None, seconds=sec or None, failures=n_trials)
    url = storage if storage is not None else s.storage
    name = s.study_name
    space = space or SearchSpace()
    limit = s.max_tokens_per_episode
    sampler = sampler or TrialSeededSampler(cfg.gspo.seed)
    study = open_study(url, name, sampler)
    try:
        config_hash = study_config.check_study_config(study, cfg, url, name)
        started_at = B.study_started_at(study)
        stopped_by: list[str] = []
        mine: list[int] = []
        conflict: list[SearchError] = []
        quiet: _QuietInterrupts | None = None

        def used(before: int | None = None) -> B.Ledger:
            return B.ledger(study.get_trials(deepcopy=False), started_at=started_at,
                            reserve_tokens=reserve_tokens, before_number=before)

        def refuse(trial: optuna.Trial, reason: str, why: str) -> NoReturn:
            trial.set_user_attr(B.ATTR_ADMITTED, False)
            trial.set_user_attr(B.ATTR_REFUSED, reason)
            stopped_by.append(reason)
            study.stop()
            raise _Refused(f"{why} before trial {trial.number} could start")

        def objective(trial: optuna.Trial, parent: ParentRun | None) -> float:
            try:
                return run_trial(trial, parent)
            except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM (components.errors.Terminated)
                if quiet is not None:
                    quiet.numbers.add(trial.number)
                with contextlib.suppress(Exception):  # best effort: the storage may be mid-write
                    trial.set_user_attr(B.ATTR_INTERRUPTED, "SIGTERM" if isinstance(exc, Terminated) else "SIGINT")
                raise

        progress = leaf("search", n_trials, "trials")  # lines inside a trial (components.progress)

        def run_trial(trial: optuna.Trial, parent: ParentRun | None) -> float:
            before = used(before=trial.number)
            reason = B.exhausted(before, limits)
            if reason is not None:
                refuse(trial, reason, f"budget used up ({reason})")
            mismatch = study_config.changed(study, config_hash, cfg, url, name)
            if mismatch is not None:  # a worker with another config recorded it last (see study_config)
                conflict.append(mismatch)
                refuse(trial, "config", "the study's recorded config changed")
            trial.set_user_attr(B.ATTR_RESERVED, B.reservation(study.get_trials(deepcopy=False), reserve_tokens))
            trial.set_user_attr(B.ATTR_CONFIG_HASH, config_hash)
            trial.set_user_attr(B.ATTR_ADMITTED, True)
            mine.append(trial.number)
            overrides = space.suggest(trial)
            trial.set_user_attr(B.ATTR_OVERRIDES, overrides)
            slot = before.admitted + 1  # the trial's place among those that count (failed ones do not)
            log.info("trial %d/%d started: %s", slot, n_trials, " ".join(overrides))
            trial_cfg = apply_overrides(cfg, overrides)
            run_ctx = (parent.child(f"trial-{trial.number}", {"study": name, "trial": trial.number})
                       if parent is not None else contextlib.nullcontext())
            with run_ctx as run:
                if run is not None:
                    run.log_params({o.split("=", 1)[0]: o.split("=", 1)[1] for o in overrides})
                t0 = time.perf_counter()
                try:
                    outcome = _check_outcome(trial_fn(trial_cfg, trial), trial.number)
                except Exception as exc:
                    trial.set_user_attr(ATTR_ERROR, redact_text(f"{type(exc).__name__}: {exc}")[:1000])
                    print(f"search: trial {slot}/{n_trials} (Optuna trial {trial.number}) failed "
                          f"({type(exc).__name__}: {redact_text(str(exc))[:300]}); it does not count: "
                          f"going on with the next trial (the search stops after {n_trials} failed trials)",
                          file=sys.stderr)
                    raise
                wall = time.perf_counter() - t0
                c = float(outcome.mean_tokens_per_episode) - limit
                trial.set_user_attr(B.ATTR_TOKENS, int(outcome.tokens_spent))
                trial.set_user_attr(B.ATTR_SECONDS, float(outcome.seconds or wall))
                trial.set_user_attr(B.ATTR_MEAN_TOKENS, float(outcome.mean_tokens_per_episode))
                trial.set_user_attr(B.ATTR_ACCURACY, float(outcome.dev_accuracy))
                trial.set_constraint(B.CONSTRAINT_KEY, c)
                if outcome.items is not None:
                    trial.set_user_attr(candidate.ATTR_ITEMS, candidate.items_to_attr(outcome.items))
                if run is not None:
                    try:
                        log_search_metrics(run, {
                            "search/dev_accuracy": outcome.dev_accuracy,
                            "search/mean_tokens_per_episode": outcome.mean_tokens_per_episode,
                            "search/constraint": c, "search/tokens_spent": outcome.tokens_spent,
                            "search/seconds": outcome.seconds})
                        run.set_tags({"feasible": c <= 0})
                    except TrackingError as exc:  # the trial's result is in the study; only its MLflow copy is lost
                        print(f"search: trial {trial.number}: metrics not logged ({exc})", file=sys.stderr)
            log.info("trial %d/%d done in %.0f s: dev accuracy %.3f, %.1f tokens/episode (limit %g); %s",
                     slot, n_trials, outcome.seconds or wall, outcome.dev_accuracy,
                     outcome.mean_tokens_per_episode, limit, _spent(used(), limits, int(outcome.tokens_spent)))
            progress.done = slot
            progress.advance(0, shown=True)  # the line above was this trial's line
            return float(outcome.dev_accuracy)

        def after_trial(study_: optuna.Study, _trial: FrozenTrial) -> None:
            reason = B.exhausted(used(), limits)
            if reason is not None:
                stopped_by.append(reason)
                study_.stop()

        parent_ctx = tracker_factory() if tracker_factory is not None else contextlib.nullcontext()
        with parent_ctx as parent:
            if parent is not None:
                parent.log_params({"search.trials": n_trials, "search.budget_tokens": tok,
                                   "search.budget_seconds": sec, "search.study_name": name,
                                   "search.max_tokens_per_episode": limit, "search.storage": redact(url)})
            reason = B.exhausted(used(), limits)
            if reason is None:
                # a refusal stops the study (study.stop above); any other failure fails one trial only
                with _quiet_interrupts() as quiet, _optuna_warnings_only(), progress.active():
                    study.optimize(lambda t: objective(t, parent), n_trials=None, callbacks=[after_trial],
                                   catch=(Exception,))
            else:
                stopped_by.append(reason)
            if not conflict and (late := study_config.changed(study, config_hash, cfg, url, name)) is not None:
                conflict.append(late)  # overwritten during this worker's last trial: its best is not ours to write
            if conflict:
                raise conflict[0]
            result = _finish(_Run(study, cfg, url, name, trial_fn), used(), stopped_by, mine)
            if parent is not None:
                _log_result(parent, result)
        return result
    finally:  # normally, on an error, on Ctrl-C: the .db file alone holds every trial
        if isinstance(url, str):  # a storage object passed in is the caller's to close
            close_storage(study._storage)


def _spent(usage: B.Ledger, limits: B.Budget, running: int = 0) -> str:
    """Budget spent so far, for the progress line: tokens (``running``: the trial that just ended,
    not yet counted as finished) and seconds against their limits."""
    tokens = f"{usage.tokens_spent + running}" + (f"/{limits.tokens}" if limits.tokens else "")
    seconds = f"{usage.seconds_elapsed:.0f}" + (f"/{limits.seconds:.0f}" if limits.seconds else "")
    return f"budget spent: {tokens} tokens, {seconds} s, {usage.admitted}/{limits.trials} trials"


@dataclass(frozen=True)
class _Run:
    """The study one :func:`run_search` call works on, for its closing steps."""

    study: optuna.Study
    cfg: Config
    url: str | optuna.storages.BaseStorage
    name: str
    trial_fn: TrialFn


def _finish(run: _Run, usage: B.Ledger, stopped_by: list[str], mine: list[int]) -> SearchResult:
    study, cfg, url, name, trial_fn = run.study, run.cfg, run.url, run.name, run.trial_fn
    out_params = cfg.search.out_params
    all_trials = study.get_trials(deepcopy=False)
    best = select_best(study_config.own_trials(study, all_trials, name))
    if best is None:
        errors = list(dict.fromkeys(t.user_attrs[ATTR_ERROR] for t in all_trials if ATTR_ERROR in t.user_attrs))
        seen = f"; trial errors: {' | '.join(errors[:3])}" if errors else ""
        raise SearchError(f"search: study {name!r} in {redact(url)} has no completed trial "
                          f"(stopped by {stopped_by[0] if stopped_by else 'unknown'}); raise search.trials "
                          f"or the budgets, or fix what failed the trials{seen}")
    overrides = list(best.user_attrs.get(B.ATTR_OVERRIDES, []))
    constraint = float(best.constraints.get(B.CONSTRAINT_KEY, math.nan))
    feasible = all(v <= 0 for v in best.constraints.values())
    mean_tokens = float(best.user_attrs.get(B.ATTR_MEAN_TOKENS, math.nan))
    # the best trial is a candidate only when it beats the profile's parameters beyond noise on the same items
    decision = candidate.judge(study, cfg, trial_fn, best)
    if decision.wins:
        write_best_params(out_params, overrides, {
            "study": name, "trial": best.number, "dev_accuracy": float(best.value or 0.0),
            "mean_tokens_per_episode": mean_tokens, "max_tokens_per_episode": cfg.search.max_tokens_per_episode,
            "constraint": constraint, "feasible": feasible, "verdict": decision.reason})
        print(f"search: {decision.reason}; wrote {out_params}", file=sys.stderr)
    else:
        print(f"search: nothing changes, {out_params} left as it was ({decision.reason})", file=sys.stderr)
    return SearchResult(
        study_name=name, storage=redact(url), best_trial=best.number, best_overrides=overrides,
        best_dev_accuracy=float(best.value or 0.0), best_mean_tokens_per_episode=mean_tokens,
        best_constraint=constraint, best_feasible=feasible,
        n_complete=sum(t.state == TrialState.COMPLETE for t in all_trials),
        n_failed=sum(B.is_failure(t) for t in all_trials),
        tokens_spent=usage.tokens_spent, seconds_elapsed=usage.seconds_elapsed,
        stopped_by=stopped_by[0] if stopped_by else "trials", params_path=str(out_params),
        trials_this_worker=mine, written=decision.wins, verdict=decision.reason,
        n_interrupted=sum(t.state == TrialState.FAIL and not B.is_refused(t) and not B.is_failure(t)
                          for t in all_trials))


def _log_result(parent: ParentRun, result: SearchResult) -> None:
    parent.log_params({f"best.{o.split('=', 1)[0]}": o.split("=", 1)[1] for o in result.best_overrides})
    parent.set_tags({"best_trial": result.best_trial, "best_feasible": result.best_feasible,
                     "stopped_by": result.stopped_by})
    log_search_metrics(parent, {
        "search/best_dev_accuracy": result.best_dev_accuracy,
        "search/best_mean_tokens_per_episode": result.best_mean_tokens_per_episode,
        "search/best_constraint": result.best_constraint, "search/tokens_spent_total": result.tokens_spent,
        "search/trials_complete": result.n_complete})
    parent.set_tags({"candidate": result.written})
    if result.written:
        parent.log_artifact(result.params_path, "search")
