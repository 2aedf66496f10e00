"""Budget accounting shared by every worker of one study: trials, tokens and wall-clock.

Everything lives in the Optuna storage, so workers on several hosts see the same totals:

* each trial carries user attrs ``search:reserved_tokens`` (an estimate written when it is
  admitted), ``search:tokens_spent`` and ``search:seconds`` (written when it finishes) and
  ``search:admitted`` (True, or False for a trial refused because the budget was used up);
* the study carries ``search:started_at`` (epoch seconds of the first worker's start).

Why per-trial attrs and not one study-level counter: Optuna storages have no atomic
increment, so two workers doing read-modify-write on a counter would lose updates; summing
per-trial records is race-free.

Admission rule (checked before a trial runs, in trial-number order; trial numbers are assigned
under a storage lock, so they totally order the trials of all workers): trial ``n`` may run
only if, over the trials numbered below ``n`` that were not refused,

    counted < trials   and   charged tokens < budget_tokens   and   now - started_at < budget_seconds
    and   failed < failures

where *counted* trials are the COMPLETE (and PRUNED) ones plus those still running or undecided,
*failed* ones are those whose trial function raised (``search:error``), a finished trial is charged
its actual ``tokens_spent`` and a running or undecided one its reservation.

Why FAIL trials do not count toward ``trials``: ``trials`` is how many results the user asked
for. A trial that failed, was interrupted (Ctrl-C, SIGTERM: ``search:interrupted``) or was
abandoned by a dead worker (marked FAIL by the heartbeat) gave none, so a rerun or another
worker runs a replacement. The failure cap (``run_search`` uses ``trials``) keeps a trial
function that always fails from looping forever; an interrupted or abandoned trial is no
failure of the configuration and is not capped. Tokens are charged for every admitted trial,
failed or not: they were spent. Guarantees:

* trials: never more than ``trials`` counted trials in the study, whatever the number of workers
  (a running trial is counted, so a trial of another worker that then fails can leave the
  study one result short until a worker runs again);
* tokens: total spent <= ``budget_tokens`` + the tokens of the last admitted trial, exactly so
  for one worker and for several workers whenever each running trial's reservation is at least
  what it really spends (the reservation is ``max(reserve_tokens, largest trial seen so far)``;
  an underestimate adds at most that shortfall per concurrently running trial);
* seconds: no trial starts after the deadline, so the study ends by ``budget_seconds`` plus
  the duration of one trial (per worker, trials run in parallel).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

ATTR_RESERVED = "search:reserved_tokens"
ATTR_TOKENS = "search:tokens_spent"
ATTR_SECONDS = "search:seconds"
ATTR_ADMITTED = "search:admitted"
ATTR_REFUSED = "search:refused"
ATTR_OVERRIDES = "search:overrides"
ATTR_MEAN_TOKENS = "search:mean_tokens_per_episode"
ATTR_ACCURACY = "search:dev_accuracy"
ATTR_ERROR = "search:error"
"""user attribute of a failed trial: the exception, type and message (URI passwords redacted)"""
ATTR_CONFIG_HASH = "search:config_hash"
"""user attribute of an admitted trial: the config hash its worker ran it under (see study_config)"""
ATTR_INTERRUPTED = "search:interrupted"
"""user attribute of a trial that Ctrl-C (``SIGINT``) or SIGTERM (``SIGTERM``) ended"""
STUDY_STARTED_AT = "search:started_at"
CONSTRAINT_KEY = "tokens_per_episode"
"""Name of the Optuna constraint: ``mean tokens per episode - search.max_tokens_per_episode``."""

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
COUNTED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
"""States of a trial that counts toward ``trials``: it gave a result or still may."""


@dataclass(frozen=True)
class Budget:
    """Study-wide limits; ``None`` means unlimited."""

    trials: int
    tokens: int | None = None
    seconds: float | None = None
    failures: int | None = None
    """Stop once this many trials have failed (their trial function raised)."""


@dataclass(frozen=True)
class Ledger:
    """What the admitted trials of a study have used so far."""

    admitted: int
    """Trials that count toward ``trials``: COMPLETE or PRUNED, or running (or not yet decided)."""
    tokens_charged: int
    """Actual tokens of finished trials + reservations of running ones."""
    tokens_spent: int
    """Actual tokens of finished trials only."""
    seconds_elapsed: float
    """Wall-clock since ``search:started_at``."""
    max_trial_tokens: int
    """Largest actual spend of one finished trial (0 if none)."""
    failed: int = 0
    """Trials whose trial function raised (see :func:`is_failure`)."""


def _int_attr(trial: FrozenTrial, key: str) -> int | None:
    value = trial.user_attrs.get(key)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def is_refused(trial: FrozenTrial) -> bool:
    """True for a trial that never ran because the budget was already used up."""
    return trial.user_attrs.get(ATTR_ADMITTED) is False


def is_failure(trial: FrozenTrial) -> bool:
    """True for a FAIL trial whose trial function raised (OOM, tracking error, bad outcome).

    Not for an interrupted trial or one a dead worker abandoned: those say nothing about the
    trial's parameters, so they neither use up the failure cap nor show as failures."""
    return trial.state == TrialState.FAIL and ATTR_ERROR in trial.user_attrs


def reservation(trials: Sequence[FrozenTrial], reserve_tokens: int) -> int:
    """Tokens to reserve for a trial about to run: ``max(reserve_tokens, largest spend so far)``."""
    spent = [t for t in (_int_attr(t, ATTR_TOKENS) for t in trials) if t is not None]
    return max([reserve_tokens, *spent])


def ledger(trials: Sequence[FrozenTrial], *, started_at: float, reserve_tokens: int = 0,
           before_number: int | None = None, now: float | None = None) -> Ledger:
    """Sum the usage of ``trials`` (only those numbered below ``before_number`` when given).

    A running trial without a reservation yet (its worker has not decided) counts as admitted
    with the current :func:`reservation`: over-counting can only refuse a trial that a later
    look would also refuse, since every limit is monotone in the trial number.
    """
    default_reserve = reservation(trials, reserve_tokens)
    admitted = charged = spent = biggest = failed = 0
    for trial in trials:
        if before_number is not None and trial.number >= before_number:
            continue
        if is_refused(trial):
            continue
        admitted += int(trial.state in COUNTED)
        failed += int(is_failure(trial))
        actual = _int_attr(trial, ATTR_TOKENS)
        reserved = _int_attr(trial, ATTR_RESERVED)
        if trial.state in FINISHED:
            cost = actual if actual is not None else (reserved or 0)
            spent += cost
            biggest = max(biggest, cost)
        else:
            cost = reserved if reserved is not None else default_reserve
        charged += cost
    now = time.time() if now is None else now
    return Ledger(admitted=admitted, tokens_charged=charged, tokens_spent=spent,
                  seconds_elapsed=max(0.0, now - started_at), max_trial_tokens=biggest, failed=failed)


def exhausted(used: Ledger, budget: Budget) -> str | None:
    """The first limit ``used`` has reached (``trials``, ``budget_tokens``, ``budget_seconds``,
    ``failures``), or None."""
    if used.admitted >= budget.trials:
        return "trials"
    if budget.tokens is not None and used.tokens_charged >= budget.tokens:
        return "budget_tokens"
    if budget.seconds is not None and used.seconds_elapsed >= budget.seconds:
        return "budget_seconds"
    if budget.failures is not None and used.failed >= budget.failures:
        return "failures"
    return None


def study_started_at(study: optuna.Study) -> float:
    """Epoch seconds when the search of ``study`` began; records it on first use.

    Two workers starting together may both write the attr; the earliest of the attr and of
    every trial's start wins, so all workers agree on one deadline.
    """
    attr = study.user_attrs.get(STUDY_STARTED_AT)
    if not isinstance(attr, int | float):
        attr = time.time()
        study.set_user_attr(STUDY_STARTED_AT, attr)
    starts = [t.datetime_start.timestamp() for t in study.get_trials(deepcopy=False)
              if t.datetime_start is not None]
    return min([float(attr), *starts])
