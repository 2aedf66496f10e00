"""The whole pipeline as one Prefect flow: prepare → validate → (search) → train → evaluate → promote.

Orchestration only: the flow validates its config once and every task runs a job of
:mod:`components.jobs` (the CLI and the DVC stages run the same jobs). Training runs as a
subprocess through the configured launcher (``deepspeed.launcher``: none → ``python -m
components.runtime.train_main``; torchrun / deepspeed for many ranks or nodes) and its progress
lines are streamed into the task log. A failed training attempt is retried with ``--resume``, so
it continues from its last checkpoint. Library progress (evaluation batches, search trials)
reaches the task logs through :func:`flows.logs.forward_logs`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.context import get_run_context

import components  # noqa: F401  (offline defaults before prefect is imported)
from components.config import Config, parse_override
from components.errors import UserError
from components.jobs import ConfigSource, EvaluateJob, PromoteJob, SearchJob, TrainJob
from components.redact import redact
from components.runtime.training_run import history_table
from components.search import load_best_params
from flows.data_prep import data_prep_flow
from flows.logs import forward_logs
from flows.run_folders import folder_overrides, run_folder, study_override, write_summary
from flows.secret_params import SecretFree, redacting

TAIL_LINES = 30
"""lines of a failed training's output logged in the task (its error line, or a traceback's end)"""


def _post(logger: Any, what: str, post: Callable[[], Any]) -> None:
    """Post an artifact; a failure (the Prefect API gone for a moment) is a warning, not a task
    failure: a retry of `train` after its work was done would resume at the last step and report
    it again, and nothing the artifact shows is lost (MLflow and the run folder hold it)."""
    try:
        post()
    except Exception as exc:  # noqa: BLE001 - any API/transport failure of a report-only call
        logger.warning("could not post the %s artifact (%s: %s); the task's result stands", what,
                       type(exc).__name__, redact(str(exc))[:200])


def _without_secrets(cfg: Config) -> Config:
    """``cfg`` with the URI passwords masked, for a subflow's parameters: Prefect stores those in its
    database and shows them in the UI (the data flow reads neither URI)."""
    return cfg.model_copy(update={"tracking": cfg.tracking.model_copy(update={"uri": redact(cfg.tracking.uri)}),
                                  "search": cfg.search.model_copy(update={"storage": redact(cfg.search.storage)})})


TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
"""where a tracking URI with a password travels instead of a flow parameter (``load_config`` reads it)"""


@contextlib.contextmanager
def secrets_kept_out(overrides: list[str]) -> Iterator[list[str]]:
    """``overrides`` without their secrets, for a flow run's parameters (Prefect stores those in its
    database and shows them in the UI; the subflow's copy of the config was masked, the top-level
    ``overrides`` were not).

    A ``tracking.uri`` holding a password (:func:`components.redact.redact` changes it) is taken out
    of the overrides and set as ``$MLFLOW_TRACKING_URI`` for the block: ``load_config`` gives an
    override and that variable the same precedence over the params file, and the training
    subprocess inherits it. Any other override holding a secret is refused (exit 2), naming it:
    Prefect would store it. The environment is restored after the block."""
    kept: list[str] = []
    uri: str | None = None
    for text in overrides:
        keys, value = parse_override(text)
        if keys == ["tracking", "uri"]:
            uri = text  # the last one wins, as in load_config
            continue
        if redact(text) != text:
            raise UserError(f"--set {redact(text)}: holds a password or token, and `agent-gspo run` stores its --set "
                            "values in Prefect's database; put it in the params file (--params) instead")
        kept.append(text)
    if uri is None or redact(uri) == uri:
        yield kept if uri is None else [*kept, uri]
        return
    before = os.environ.get(TRACKING_URI_ENV)
    os.environ[TRACKING_URI_ENV] = str(parse_override(uri)[1])
    try:
        yield kept
    finally:
        if before is None:
            os.environ.pop(TRACKING_URI_ENV, None)
        else:
            os.environ[TRACKING_URI_ENV] = before


def run_pipeline(profile: str | None, params: str | None, overrides: list[str]) -> dict[str, Any]:
    """:func:`pipeline_flow` with the secrets of ``overrides`` kept out of its stored parameters
    (:func:`secrets_kept_out`); what ``agent-gspo run`` calls."""
    with secrets_kept_out(overrides) as safe:
        return pipeline_flow(profile=profile, params=params, overrides=safe)


def _not_user_error(task: Any, task_run: Any, state: Any) -> bool:
    """Retry anything but bad input: a UserError fails the same way every time."""
    try:
        state.result()
    except UserError:
        return False
    except Exception:
        return True
    return False


@task(name="search", cache_policy=NO_CACHE)
def search_task(cfg: Config) -> list[str]:
    """The search; its best parameters when they beat the profile's beyond noise (the candidate), else []."""
    with forward_logs() as logger:
        result = SearchJob(cfg=cfg).run()
        if not result.written:
            logger.info("search: nothing changes, %s left as it was (%s)", result.params_path, result.verdict)
    _post(logger, "search-result", lambda: create_markdown_artifact(key="search-result", markdown=(
        f"# Search\n\nStudy `{result.study_name}` in `{result.storage}`: {result.n_complete} trials, "
        f"stopped by **{result.stopped_by}**, {result.tokens_spent} tokens.\n\n"
        f"Best dev accuracy {result.best_dev_accuracy} at {result.best_mean_tokens_per_episode} tokens/episode "
        f"(feasible: {result.best_feasible}).\n\n`{' '.join(result.best_overrides)}`\n\n"
        f"{'Written to' if result.written else 'Not written; left as it was:'} `{result.params_path}` "
        f"({result.verdict})\n")))
    return load_best_params(result.params_path) if result.written else []


@task(name="train", retries=2, retry_delay_seconds=5, retry_condition_fn=_not_user_error, cache_policy=NO_CACHE)
def train_task(cfg: Config, source: ConfigSource) -> dict[str, Any]:
    """Train in a subprocess: the first attempt starts over (``--overwrite``: a pipeline run trains
    from scratch), a retry resumes from the newest checkpoint."""
    attempt = getattr(get_run_context().task_run, "run_count", 1)
    tail: deque[str] = deque(maxlen=TAIL_LINES)

    def on_line(line: str) -> bool:
        """Progress lines go to the task log (which the terminal shows too: not echoed again)."""
        tail.append(line)
        if line.startswith(("step ", "resumed", "registered ")) or " was registered by this run" in line:
            logger.info(line)
            return True
        return False

    with forward_logs() as logger:
        resume = attempt > 1
        job = TrainJob(cfg=cfg, source=source, resume=resume, overwrite=not resume, isolate=True, on_line=on_line)
        logger.info("attempt %d%s: %s", attempt, " (resume)" if resume else "", redact(" ".join(job.args())))
        try:
            result = job.run()
        except BaseException:  # why it failed, in the task log (the UI), not only on the worker's terminal
            logger.error("training output, last %d lines:\n%s", len(tail), redact("\n".join(tail)))
            raise
    keys = ["train/reward", "train/accuracy", "train/budget_tokens", "train/budget", "train/lambda_tok",
            "train/silence_rate"]
    _post(logger, "training-curves", lambda: create_markdown_artifact(
        key="training-curves", markdown="# Training\n\n" + history_table(result.history, keys),
        description=f"{len(result.history)} steps, model version {result.model_version}"))
    return {"final_model": str(result.final_model), "steps": result.steps, "run_id": result.run_id,
            "model_version": result.model_version}


@task(name="evaluate", retries=1, retry_condition_fn=_not_user_error, cache_policy=NO_CACHE)
def evaluate_task(cfg: Config, model: str | None) -> dict:
    with forward_logs() as logger:
        result = EvaluateJob(cfg=cfg, model=model).run()
    _post(logger, "evaluation", lambda: create_markdown_artifact(key="evaluation", markdown=result.report.markdown,
                                                                 description="systems × benchmarks"))
    return {"summary": result.report.summary, "paths": [str(p) for p in result.report.paths.values()],
            "setting": result.setting.key(), "run_id": result.run_id}


@task(name="promote", cache_policy=NO_CACHE)
def promote_task(cfg: Config, candidate: str) -> dict:
    with forward_logs() as logger:
        decision = PromoteJob(cfg=cfg, candidate=candidate, evaluate_champion=True).run()
        logger.info("%s", decision.block())  # the rule, the intervals and the decision, as the CLI prints them
    row = {"model": decision.name, "version": decision.version, "decision": decision.decision,
           "reason": decision.reason, "compared_to": str(decision.compared_to), "setting": decision.setting,
           "rule": decision.rule}
    _post(logger, "promotion", lambda: create_table_artifact(key="promotion", table=[row],
                                                             description="promotion gate decision"))
    return row


def with_best_params(source: ConfigSource, best_params: str | None, log: Callable[[str], Any]) -> ConfigSource:
    """``source`` with the search's best parameters under its own overrides (which still win); a
    missing file is logged and skipped (no search has run yet)."""
    if not best_params:
        return source
    if not Path(best_params).is_file():
        log(f"no best-parameters file at {best_params} yet; training with the profile's parameters")
        return source
    overrides = load_best_params(best_params)
    log(f"applying the search's best parameters from {best_params}: {' '.join(overrides)}")
    return source.plus(overrides)


def _source(profile: str | None, params: str | None, overrides: list[str] | None, folder: Path | None, *,
            prepares_data: bool) -> ConfigSource:
    """The caller's config; a dated run folder's output paths and its own search study go under the
    caller's overrides (which win)."""
    source = ConfigSource(params=params, profile=profile, overrides=tuple(overrides or ()))
    if folder is None:
        return source
    study = study_override(source.load().search.study_name, folder)
    get_run_logger().info("this run writes under %s (never into DVC's outputs); a search runs in its own study (%s)",
                          folder, study)
    return source.plus([*folder_overrides(folder, prepares_data=prepares_data), study])


@redacting
@flow(name="agent-gspo-pipeline", log_prints=True)
def pipeline_flow(profile: SecretFree | None = None, params: SecretFree | None = None,
                  overrides: list[SecretFree] | None = None, best_params: SecretFree | None = None,
                  run_root: SecretFree | None = None) -> dict[str, Any]:
    """prepare → validate → (search when ``search.enabled``) → train → evaluate → promote.

    ``best_params``: a best-parameters file (``search.out_params`` of the weekly search, written only
    when its best trial beat the profile beyond noise) applied under the overrides; the nightly
    deployment passes it. The result still goes through the promotion gate like any trained model.
    ``run_root``: write into a dated folder under it (:mod:`flows.run_folders`); a deployed run does so
    under ``runs/scheduled`` by default.
    """
    folder = run_folder(run_root)
    source = with_best_params(_source(profile, params, overrides, folder, prepares_data=True),
                              best_params, get_run_logger().info)
    cfg = source.load()  # validated once; tasks receive it
    data_prep_flow(cfg=_without_secrets(cfg))
    if cfg.search.enabled:
        source = source.plus(search_task(cfg))
        cfg = source.load()
    trained = train_task(cfg, source)
    version = trained.get("model_version")
    model = f"models:/{cfg.registry.model_name}/{version}" if version else trained.get("final_model")
    evaluation = evaluate_task(cfg, model)
    promotion = promote_task(cfg, model) if version else {"decision": "skipped", "reason": "model not registered"}
    result = {"model": model, "summary": evaluation["summary"], "promotion": promotion}
    write_summary(folder, "pipeline", {**result, "folder": str(folder), "overrides": list(source.overrides)})
    return result


@redacting
@flow(name="agent-gspo-search", log_prints=True)
def search_flow(profile: SecretFree | None = None, params: SecretFree | None = None,
                overrides: list[SecretFree] | None = None, run_root: SecretFree | None = None) -> list[str]:
    """The weekly search alone: its best parameters land in ``search.out_params`` only as a candidate
    that beats the profile's beyond noise (returned; [] when nothing changed). With a run folder (a
    deployed run, or ``run_root``) it searches in a study of its own (:func:`flows.run_folders.study_override`),
    so every scheduled week runs its trials; by hand it joins (resumes) ``search.study_name``."""
    folder = run_folder(run_root)
    cfg = _source(profile, params, overrides, folder, prepares_data=False).load()
    best = search_task(cfg)
    write_summary(folder, "search", {"candidate": best, "study": cfg.search.study_name,
                                     "storage": redact(cfg.search.storage)})
    return best


@redacting
@flow(name="agent-gspo-evaluate", log_prints=True)
def evaluate_flow(profile: SecretFree | None = None, params: SecretFree | None = None,
                  overrides: list[SecretFree] | None = None, model: SecretFree | None = None,
                  run_root: SecretFree | None = None) -> dict:
    """On-demand evaluation of a policy (a folder, HF id or ``models:/`` URI); a deployed run writes
    its evaluation into its dated folder, not ``eval/``."""
    folder = run_folder(run_root)
    result = evaluate_task(_source(profile, params, overrides, folder, prepares_data=False).load(), model)
    write_summary(folder, "evaluate", result)
    return result


if __name__ == "__main__":
    print(json.dumps(pipeline_flow(profile=sys.argv[1] if len(sys.argv) > 1 else None), indent=2, default=str))
