"""The search job: budget-constrained Optuna search whose trial is a short GSPO run + a dev evaluation.

The space is :data:`components.search.DEFAULT_SPACE` bounded by the profile's sizes
(:meth:`components.search.SearchSpace.within`): a trial never samples more agents, rounds or
episodes per question than the profile it runs under, so a smoke search stays a smoke-sized job.
"""

from __future__ import annotations

import ctypes
import gc
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import optuna
from pydantic import Field

from components.comparison import ItemScore
from components.config import Config
from components.evaluation import EvalRequest, evaluate
from components.io import check_not_pipeline_input, check_output_file
from components.jobs.base import Job
from components.runtime.training_run import train
from components.search import SearchResult, SearchSpace, TrialOutcome, Worker, mlflow_tracker_factory, run_search


def release_memory() -> None:
    """Collect what the last model held and hand the freed heap back to the OS.

    glibc keeps freed heap pages mapped, so without ``malloc_trim`` the evaluation's model would be
    allocated on top of the peak the training left behind (a smoke trial measured 4.2 GB instead of
    the 3.6 GB its training needs)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


@dataclass
class SearchTrial:
    """The real trial: a short GSPO run from the configured model, then the dev slice evaluation.

    Dev slice: the official development splits (``aqua/dev``, ``mmlu/val``; never a test split),
    ``search.dev_items`` seeded items each, the trained MAS only. Constraint measure: mean completion
    tokens per episode, the same measure as the dual budget's default. The per-item results (same
    seeded items for every trial and for the baseline, :class:`components.search.candidate.BaselineTrial`)
    decide whether the best trial beats the profile's parameters.
    """

    data_dir: Path | None = None

    def __call__(self, trial_cfg: Config, trial: optuna.Trial) -> TrialOutcome:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f"trial-{trial.number}-") as tmp:
            result = train(trial_cfg, max_steps=trial_cfg.search.trial_steps, out_dir=Path(tmp) / "run",
                           data_dir=self.data_dir, track=False)
            release_memory()  # the trained model and its optimizer state go before the evaluation loads the policy
            train_tokens = int(sum(h.get("train/tokens_total", 0.0) * trial_cfg.gspo.questions_per_step
                                   * trial_cfg.gspo.group_size for h in result.history))
            ev_cfg = trial_cfg.model_copy(update={"eval": trial_cfg.eval.model_copy(update={
                "benchmarks": ["aqua", "mmlu"], "baselines": []})})
            accs, tokens, n, spent, items = [], 0.0, 0, 0, {}
            for bench, split in (("aqua", "dev"), ("mmlu", "val")):
                one = ev_cfg.model_copy(update={"eval": ev_cfg.eval.model_copy(update={"benchmarks": [bench]})})
                rep = evaluate(one, EvalRequest(model=str(result.final_model), limit=trial_cfg.search.dev_items,
                               baselines=[], out_dir=Path(tmp) / f"eval-{bench}", data_dir=self.data_dir, split=split))
                s = rep.summary["agent_gspo"]
                accs.append(float(s["accuracy"]))
                tokens += float(s["tokens_completion"])
                n += int(s["n"])
                spent += int(s["tokens_total"])
                items[bench] = [ItemScore(o.id, o.correct, float(o.tokens_total))
                                for o in rep.per_item["agent_gspo"][bench]]
                release_memory()
        return TrialOutcome(dev_accuracy=sum(accs) / len(accs), mean_tokens_per_episode=tokens / max(1, n),
                            tokens_spent=train_tokens + spent, seconds=time.perf_counter() - t0, items=items)


class SearchJob(Job):
    """``agent-gspo search``: writes the best parameters to ``search.out_params`` when they beat the profile's."""

    KIND = "search"
    trials: int | None = Field(None, ge=1, description="study-wide trial target (default search.trials)")
    budget_tokens: int | None = Field(None, ge=0, description="study-wide token budget (default search.budget_tokens)")
    storage: str | None = Field(None, description="Optuna storage URL (default search.storage)")
    track: bool = Field(True, description="log a parent MLflow run with one nested run per trial")

    def check_outputs(self) -> None:
        """Refuse (exit 2, before any trial) a best-params file or sqlite study that is an input of
        the pipeline: ``--set search.out_params=params.yaml`` replaced the params file."""
        check_output_file(self.cfg.search.out_params, "best-params file (search.out_params)")
        url = self.storage or self.cfg.search.storage or ""
        if url.startswith("sqlite:///"):
            check_not_pipeline_input(url[len("sqlite:///"):].split("?", 1)[0],
                                     "Optuna storage (--storage / search.storage)")

    def run(self) -> SearchResult:
        """:class:`components.search.SearchResult` of the whole study."""
        cfg = self.cfg
        self.check_outputs()
        flags = {k: v for k, v in (("trials", self.trials), ("budget_tokens", self.budget_tokens)) if v is not None}
        study_cfg = cfg.model_copy(update={"search": cfg.search.model_copy(update=flags)})  # = --set search.<key>
        worker = Worker(storage=self.storage, tracker_factory=mlflow_tracker_factory(cfg) if self.track else None)
        return run_search(study_cfg, SearchTrial(Path(cfg.data.out_dir)), space=SearchSpace.within(cfg), worker=worker)
