"""Synthetic results files for the experiments tests (no test here; imported by test_experiments*.py)."""

from __future__ import annotations

import math
from typing import Any

from experiments.results import SCHEMA_VERSION, BudgetInfo, ResultsFile

SETTINGS = {"model.name": "tiny-random", "mas.agents": 3, "mas.rounds": 2, "mas.topology": "complete",
            "mas.max_message_tokens": 32, "mas.context_tokens": 256, "mas.silence_marker": "<silent>",
            "eval.limit": 100, "eval.seed": 1234, "eval.benchmarks": ["gsm8k", "svamp"]}


def cell(acc: float, tokens_total: int, n: int = 100, completion: int | None = None, silence: float = 0.0) -> dict:
    """One EvalCell: accuracy ``acc`` over ``n`` items, ``tokens_total`` summed (completion = a third)."""
    correct = round(acc * n)
    acc = correct / n
    completion = tokens_total // 3 if completion is None else completion
    prompt = tokens_total - completion
    return {"n": n, "correct": correct, "accuracy": acc, "accuracy_se": math.sqrt(acc * (1 - acc) / n),
            "tokens_prompt": prompt, "tokens_completion": completion, "tokens_communicated": completion,
            "tokens_total": tokens_total, "tokens_prompt_mean": prompt / n, "tokens_completion_mean": completion / n,
            "tokens_communicated_mean": completion / n, "tokens_total_mean": tokens_total / n,
            "tokens_per_correct": tokens_total / correct if correct else None, "turns": 6.0, "messages": 6.0,
            "silence_rate": silence, "grading_errors": 0}


def history(budget_tokens: list[float], reward: list[float] | None = None, accuracy: float = 0.3,
            lam: float = 0.1, kl_base: float = 0.02, episodes: float = 22.0) -> list[dict[str, float]]:
    """One dict per step with the metrics the report reads (22 episodes a step: the last 3 steps
    hold the 64 the budget rule needs; KL from the base 0.02: the run moved; λ_tok alternating by ~0.01,
    never the same value twice: a controller that settled, so budget tracking inside the band counts as held)."""
    reward = reward or [0.1] * len(budget_tokens)
    return [{"step": float(i + 1), "train/budget_tokens": t, "train/reward": r, "train/accuracy": accuracy,
             "train/lambda_tok": lam + 0.01 * (i % 2) + 1e-4 * i, "train/budget": 100.0, "train/silence_rate": 0.2,
             "train/tokens_completion": t, "gspo/grad_norm": 1.0, "silence/agent0_round0": 0.1,
             "silence/agent1_round1": 0.3, "gspo/kl_base": kl_base * (i + 1) / len(budget_tokens),
             "train/episodes": episodes}
            for i, (t, r) in enumerate(zip(budget_tokens, reward, strict=True))]


def columns(correct: list[bool], completion: list[int] | None = None) -> dict:
    """Per-item outcomes of one system on one benchmark (ItemColumns as JSON)."""
    completion = completion if completion is not None else [10] * len(correct)
    return {"correct": correct, "tokens_total": [3 * c for c in completion], "tokens_completion": completion}


def cell_of(col: dict) -> dict:
    """The EvalCell per-item ``columns`` add up to (a results file must keep the two in agreement)."""
    n, correct = len(col["correct"]), sum(col["correct"])
    c = cell(correct / n, sum(col["tokens_total"]), n=n, completion=sum(col["tokens_completion"]))
    return c | {"tokens_communicated": c["tokens_completion"], "tokens_communicated_mean": c["tokens_completion"] / n}


def make_results(name: str, eval_: dict[str, dict[str, dict]], *, kind: str = "gspo", hist: list | None = None,
                 budget_target: float | None = None, fraction: float = 0.25, item_ids: str = "a" * 64,
                 last_k: int = 3, **extra: Any) -> ResultsFile:
    """A valid results file; the cells of systems with per-item ``items`` are the sums of those items."""
    eval_ = {s: dict(cells) for s, cells in eval_.items()}
    for system, per_bench in (extra.get("items") or {}).items():
        for bench, col in per_bench.items():
            eval_.setdefault(system, {})[bench] = cell_of(col)
    budget = None
    if budget_target is not None:
        if hist:  # the B the controller logged each step is the run's B (history() writes 100)
            hist = [h | {"train/budget": budget_target} if "train/budget" in h else h for h in hist]
        budget = BudgetInfo(fraction=fraction, target=budget_target, measure="completion",
                            figure="tokens_completion_mean", system="mas_untrained", benchmarks=["gsm8k"],
                            baseline_mean=budget_target / fraction, source="baselines.json")
    summary = {s: {"accuracy": sum(c["accuracy"] for c in cells.values()) / len(cells),
                   "tokens_total": sum(c["tokens_total"] for c in cells.values())} for s, cells in eval_.items()}
    raw = {"schema_version": SCHEMA_VERSION, "name": name, "kind": kind, "label": extra.pop("label", name),
           "description": f"synthetic {name}", "extends": None, "overrides": [], "profile": "results",
           "config_hash": "c" * 64, "data_manifest_sha256": "d" * 64, "model": "tiny-random",
           "trained_model": None if kind == "baselines" else f"runs/{name}/final", "seed": 0, "eval_seed": 1234,
           "limit": 100, "benchmarks": ["gsm8k", "svamp"], "item_ids_sha256": item_ids, "settings": dict(SETTINGS),
           "budget": budget, "last_k": last_k, "git_commit": "f" * 40, "wall_seconds": 10.0,
           "train_seconds": None if kind == "baselines" else 5.0, "eval_seconds": 5.0,
           "mlflow": {"train_run_id": None, "eval_run_id": "r1", "model_version": None}, "eval": eval_,
           "summary": summary, "history": hist or ([] if kind == "baselines" else history([100.0]))}
    raw.update(extra)
    return ResultsFile.model_validate(raw)


def baselines(mas_tokens: int = 100_000, mas_acc: float = 0.30) -> ResultsFile:
    return make_results("baselines", {
        "single_cot": {"gsm8k": cell(0.20, 20_000), "svamp": cell(0.25, 18_000)},
        "self_consistency": {"gsm8k": cell(0.22, 60_000), "svamp": cell(0.27, 55_000)},
        "mas_untrained": {"gsm8k": cell(mas_acc, mas_tokens, completion=30_000),
                          "svamp": cell(mas_acc, mas_tokens, completion=24_000)}}, kind="baselines")


def trained(name: str, acc: float, tokens: int, hist: list | None = None, budget_target: float | None = None,
            **kw: Any) -> ResultsFile:
    return make_results(name, {"agent_gspo": {"gsm8k": cell(acc, tokens), "svamp": cell(acc, tokens)}},
                        hist=hist, budget_target=budget_target, **kw)
