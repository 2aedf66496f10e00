"""Pipeline jobs: the units the CLI, the Prefect flows and the DVC stages run.

Each job takes the validated :class:`Config` plus the few per-call options, does its work through
the component functions, tracks it in MLflow, and returns a small result. Nothing here imports
Prefect: flows wrap these calls in tasks, the CLI prints their results.
"""

from __future__ import annotations

import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.config import Config
from components.errors import UserError

MODEL_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:/(?P<version>\d+)|@(?P<alias>[\w-]+))?$")


def _registry_version(cfg: Config, uri: str | None) -> tuple[str, str] | None:
    """``(name, version)`` for a ``models:/`` URI (latest version when none given); None otherwise."""
    if uri is None or not uri.startswith("models:/"):
        return None
    m = MODEL_URI.match(uri)
    if m is None:
        raise UserError(f"model URI {uri!r}: expected models:/<name>, models:/<name>/<version> "
                        "or models:/<name>@<alias>")
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=cfg.tracking.uri)
    name = m["name"]
    if m["version"]:
        return name, m["version"]
    if m["alias"]:
        return name, str(client.get_model_version_by_alias(name, m["alias"]).version)
    versions = client.search_model_versions(f"name='{name}'")
    if not versions:
        raise UserError(f"{uri}: registered model {name!r} has no versions (train first)")
    return name, str(max(int(v.version) for v in versions))


def evaluate_job(cfg: Config, *, model: str | None = None, limit: int | None = None,
                 baselines: list[str] | None = None, out_dir: str | Path | None = None, track: bool = True) -> Any:
    """Evaluate a policy (+ baselines) on the benchmarks; tag the registry version with the results.

    When ``model`` is a ``models:/`` URI, the version gets ``eval.accuracy`` / ``eval.tokens_total``
    and the evaluation set's identity (config hash, data manifest hash, item sample) as tags: the
    promotion gate compares versions only on those tags.
    """
    from components.evaluation import evaluate

    version = _registry_version(cfg, model)
    if version is not None and model is not None and "/" not in model.removeprefix("models:/") and "@" not in model:
        model = f"models:/{version[0]}/{version[1]}"
    if not track:
        return evaluate(cfg, model=model, limit=limit, baselines=baselines, out_dir=Path(out_dir) if out_dir else None)
    from components.tracking import Tracker, write_eval_tags

    tags = {"stage": "evaluate", "eval.model": model or cfg.model.name}
    with Tracker.from_config(cfg, "evaluate", tags) as tracker:
        report = evaluate(cfg, model=model, limit=limit, baselines=baselines,
                          out_dir=Path(out_dir) if out_dir else None, tracker=tracker)
        if version is not None:
            from mlflow import MlflowClient

            main = report.summary["agent_gspo"]
            write_eval_tags(MlflowClient(tracking_uri=cfg.tracking.uri), version[0], version[1],
                            accuracy=float(main["accuracy"]), tokens_total=float(main["tokens_total"]),
                            extra={"eval.run_id": tracker.run_id, "eval.limit": str(report.meta["limit"]),
                                   "eval.seed": str(report.meta["seed"]),
                                   "eval.data_manifest_sha256": str(report.meta["data_manifest_sha256"])})
    return report


def promote_job(cfg: Config, candidate: str | None = None) -> Any:
    """Gate ``candidate`` (default: the newest version of ``registry.model_name``) against @champion."""
    from mlflow import MlflowClient

    from components.tracking import promote

    name, version = _registry_version(cfg, candidate or f"models:/{cfg.registry.model_name}") or (None, None)
    if name is None:
        raise UserError(f"--candidate {candidate!r}: give a registry URI models:/<name>[/<version>|@<alias>]")
    reg = cfg.registry
    return promote(MlflowClient(tracking_uri=cfg.tracking.uri), name, version,
                   accuracy_tolerance=reg.accuracy_tolerance, max_token_ratio=reg.max_token_ratio,
                   min_accuracy=reg.min_accuracy)


@dataclass
class SearchTrial:
    """The real trial: a short GSPO run from the configured model, then the dev slice evaluation.

    Dev slice: the official development splits (``aqua/dev``, ``mmlu/val``; never a test split),
    ``search.dev_items`` seeded items each, the trained MAS only. Constraint measure: mean completion
    tokens per episode, the same measure as the dual budget's default.
    """

    data_dir: Path | None = None

    def __call__(self, trial_cfg: Config, trial: Any) -> Any:
        from components.evaluation import evaluate
        from components.gspo.job import train
        from components.search import TrialOutcome

        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f"trial-{trial.number}-") as tmp:
            result = train(trial_cfg, max_steps=trial_cfg.search.trial_steps, out_dir=Path(tmp) / "run",
                           data_dir=self.data_dir, track=False)
            train_tokens = int(sum(h.get("train/tokens_total", 0.0) * trial_cfg.gspo.questions_per_step
                                   * trial_cfg.gspo.group_size for h in result.history))
            ev_cfg = trial_cfg.model_copy(update={"eval": trial_cfg.eval.model_copy(update={
                "benchmarks": ["aqua", "mmlu"], "baselines": []})})
            accs, tokens, n, spent = [], 0.0, 0, 0
            for bench, split in (("aqua", "dev"), ("mmlu", "val")):
                one = ev_cfg.model_copy(update={"eval": ev_cfg.eval.model_copy(update={"benchmarks": [bench]})})
                rep = evaluate(one, model=str(result.final_model), limit=trial_cfg.search.dev_items, baselines=[],
                               out_dir=Path(tmp) / f"eval-{bench}", data_dir=self.data_dir, split=split)
                s = rep.summary["agent_gspo"]
                accs.append(float(s["accuracy"]))
                tokens += float(s["tokens_completion"])
                n += int(s["n"])
                spent += int(s["tokens_total"])
        return TrialOutcome(dev_accuracy=sum(accs) / len(accs), mean_tokens_per_episode=tokens / max(1, n),
                            tokens_spent=train_tokens + spent, seconds=time.perf_counter() - t0)


def search_job(cfg: Config, *, trials: int | None = None, budget_tokens: int | None = None,
               storage: str | None = None, track: bool = True) -> Any:
    """Budget-constrained Optuna search with :class:`SearchTrial`; writes ``search.out_params``."""
    from components.search import mlflow_tracker_factory, run_search

    return run_search(cfg, SearchTrial(Path(cfg.data.out_dir)), trials=trials,
                      budget_tokens=budget_tokens if budget_tokens is not None else (cfg.search.budget_tokens or None),
                      budget_seconds=cfg.search.budget_seconds or None, storage=storage,
                      tracker_factory=mlflow_tracker_factory(cfg) if track else None)
