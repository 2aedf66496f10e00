"""The whole pipeline as one Prefect flow: prepare → validate → (search) → train → evaluate → promote.

Orchestration only; every task calls the function the CLI and DVC stages call
(:mod:`flows.data_prep`, :func:`components.gspo.launch.launch_training`,
:mod:`components.jobs`). Training runs as a subprocess through the configured launcher
(``deepspeed.launcher``: none → ``python -m components.gspo.train_main``; torchrun / deepspeed
for many ranks or nodes) and its progress lines are streamed into the task log. A failed
training attempt is retried with ``--resume``, so it continues from its last checkpoint.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.context import get_run_context

import components  # noqa: F401  (offline defaults before prefect is imported)
from components.config import Config, load_config
from components.errors import UserError
from components.redact import redact
from flows.data_prep import data_prep_flow


def _cfg(profile: str | None, params: str | None, overrides: list[str] | None) -> Config:
    return load_config(params, profile, overrides)


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
def search_task(profile: str | None, params: str | None, overrides: list[str]) -> list[str]:
    from components.jobs import search_job
    from components.search import load_best_params

    cfg = _cfg(profile, params, overrides)
    result = search_job(cfg)
    create_markdown_artifact(key="search-result", markdown=(
        f"# Search\n\n{result.n_complete} trials, stopped by **{result.stopped_by}**, {result.tokens_spent} tokens.\n\n"
        f"Best dev accuracy {result.best_dev_accuracy} at {result.best_mean_tokens_per_episode} tokens/episode "
        f"(feasible: {result.best_feasible}).\n\n`{' '.join(result.best_overrides)}`\n"))
    return load_best_params(result.params_path)


@task(name="train", retries=2, retry_delay_seconds=5, retry_condition_fn=_not_user_error, cache_policy=NO_CACHE)
def train_task(profile: str | None, params: str | None, overrides: list[str]) -> dict[str, Any]:
    """Launch training as a subprocess: the first attempt starts over (``--overwrite``: a pipeline
    run trains from scratch), a retry resumes from the newest checkpoint."""
    from components.gspo.job import history_table
    from components.gspo.launch import MODULE, forwarded_args, launch_env, launcher_command, run_streaming

    logger = get_run_logger()
    cfg = _cfg(profile, params, overrides)
    attempt = getattr(get_run_context().task_run, "run_count", 1)
    resume = attempt > 1
    args = SimpleNamespace(params=params, profile=profile, overrides=overrides, no_track=False)
    train_args = forwarded_args(args, resume=resume, max_steps=None, out_dir=None, overwrite=not resume)
    cmd = ([sys.executable, "-m", MODULE, *train_args] if cfg.deepspeed.launcher == "none"
           else launcher_command(cfg, train_args))
    logger.info("attempt %d%s: %s", attempt, " (resume)" if resume else "", redact(" ".join(cmd)))
    result: dict[str, Any] = {}

    def on_line(line: str) -> None:
        if line.startswith("step "):
            logger.info(line)
        elif line.startswith("{") and '"final_model"' in line:
            result.update(json.loads(line))

    rc = run_streaming(cmd, env=launch_env(), on_line=on_line)
    if rc != 0:
        raise RuntimeError(f"training exited with code {rc} (attempt {attempt}); a retry resumes from the "
                           f"last checkpoint in {cfg.gspo.out_dir}")
    history = json.loads((Path(cfg.gspo.out_dir) / "history.json").read_text())
    keys = ["train/reward", "train/accuracy", "train/budget_tokens", "train/budget", "train/lambda_tok",
            "train/silence_rate"]
    create_markdown_artifact(key="training-curves", markdown="# Training\n\n" + history_table(history, keys),
                             description=f"{len(history)} steps, model version {result.get('model_version')}")
    return result


@task(name="evaluate", retries=1, retry_condition_fn=_not_user_error, cache_policy=NO_CACHE)
def evaluate_task(profile: str | None, params: str | None, overrides: list[str], model: str | None) -> dict:
    from components.jobs import evaluate_job

    cfg = _cfg(profile, params, overrides)
    report = evaluate_job(cfg, model=model)
    create_markdown_artifact(key="evaluation", markdown=report.markdown, description="systems × benchmarks")
    return {"summary": report.summary, "paths": [str(p) for p in report.paths.values()]}


@task(name="promote", cache_policy=NO_CACHE)
def promote_task(profile: str | None, params: str | None, overrides: list[str], candidate: str) -> dict:
    from components.jobs import promote_job

    decision = promote_job(_cfg(profile, params, overrides), candidate)
    row = {"model": decision.name, "version": decision.version, "decision": decision.decision,
           "reason": decision.reason, "compared_to": str(decision.compared_to)}
    create_table_artifact(key="promotion", table=[row], description="promotion gate decision")
    return row


@flow(name="agent-gspo-pipeline", log_prints=True)
def pipeline_flow(profile: str | None = None, params: str | None = None,
                  overrides: list[str] | None = None) -> dict[str, Any]:
    """prepare → validate → (search when ``search.enabled``) → train → evaluate → promote."""
    overrides = list(overrides or [])
    cfg = _cfg(profile, params, overrides)
    data_prep_flow(profile=profile, params=params, overrides=overrides)
    if cfg.search.enabled:
        overrides = search_task(profile, params, overrides) + overrides
    trained = train_task(profile, params, overrides)
    version = trained.get("model_version")
    model = f"models:/{cfg.registry.model_name}/{version}" if version else trained.get("final_model")
    evaluation = evaluate_task(profile, params, overrides, model)
    promotion = promote_task(profile, params, overrides, model) if version else {"decision": "skipped",
                                                                                 "reason": "model not registered"}
    return {"model": model, "summary": evaluation["summary"], "promotion": promotion}


@flow(name="agent-gspo-search", log_prints=True)
def search_flow(profile: str | None = None, params: str | None = None, overrides: list[str] | None = None) -> list[str]:
    """The weekly search alone (its best parameters land in ``search.out_params``)."""
    return search_task(profile, params, list(overrides or []))


@flow(name="agent-gspo-evaluate", log_prints=True)
def evaluate_flow(profile: str | None = None, params: str | None = None, overrides: list[str] | None = None,
                  model: str | None = None) -> dict:
    """On-demand evaluation of a policy (a folder, HF id or ``models:/`` URI)."""
    return evaluate_task(profile, params, list(overrides or []), model)


if __name__ == "__main__":
    print(json.dumps(pipeline_flow(profile=sys.argv[1] if len(sys.argv) > 1 else None), indent=2, default=str))
