"""The Agent-GSPO training loop (one readable file, cleanRL style).

One step:
  1. take the next ``questions_per_step`` training questions (deterministic cursor, reshuffled
     per epoch by the seed) and keep this rank's shard;
  2. play G multi-agent episodes per question with the current policy (rollout → vote → grade);
  3. reward every episode with the current λ_tok;
  4. build the step batch: one all-gather gives group-normalised advantages and all-rank metrics
     (:class:`components.gspo.step_batch.StepBatch`);
  5. recompute π_old once, on the very micro-batches the updates will score (same shapes: in bf16
     another batch shape rounds differently), then μ mini-batch updates with the policy loss named
     by ``gspo.level`` (off-policy after the first, so clipping acts); the engine owns gradient
     accumulation;
  6. dual ascent on λ_tok with the all-rank mean token use; metrics, all-rank means (one more
     small all-gather for the loss metrics); the job checkpoints.

With W ranks, ``questions_per_step`` must be a multiple of W and give every rank at least
``minibatches x grad_accum`` messages, so every rank enters every collective
(:func:`components.config.rank_split_problem`, checked at config load and here).

The trainer is engine-agnostic and distributed-agnostic (world size 1 is the ordinary case): it
sees the runtime only through :mod:`components.gspo.policy_engine` (an engine whose ``update``
makes one optimizer update; the ranks it runs on). Everything is driven by the typed :class:`Config`;
checkpoints, resume checks and the loop around the steps are the runtime's
(:mod:`components.runtime.training_run`).
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from components.config import Config, rank_split_problem
from components.data.item import Item
from components.errors import UserError
from components.gspo.batching import SequenceBatch, minibatch_indices
from components.gspo.logprobs import Sampling, completion_logprobs
from components.gspo.loss import LossOutput, LossSettings, get_policy_loss
from components.gspo.memory import PhasePeaks
from components.gspo.policy_engine import PolicyEngine, Ranks
from components.gspo.step_batch import StepBatch
from components.mas.environment import Environment
from components.mas.records import Episode
from components.models.lora import disabled_adapters, has_adapters
from components.progress import leaf
from components.reward.budget import DualBudgetController
from components.reward.reward import apply_rewards


@dataclass
class QuestionSampler:
    """Deterministic pass over the training items: shuffled per epoch with ``seed + epoch``.

    ``cursor`` counts items handed out so far; it is saved with every checkpoint so a resumed
    run draws exactly the questions an uninterrupted run would. ``mix="balanced"`` takes the
    benchmarks in turn (question ``c`` from benchmark ``c mod B``, in order of first appearance),
    each with its own per-epoch shuffle, so a 64-item source mixed with a 7,473-item one gets half
    the questions instead of under 1 %; the cursor alone still fixes every draw.
    """

    items: Sequence[Item]
    seed: int
    cursor: int = 0
    mix: str = "pooled"

    def __post_init__(self) -> None:
        if self.mix not in ("pooled", "balanced"):
            raise ValueError(f"mix must be 'pooled' or 'balanced', got {self.mix!r}")
        groups: dict[str, list[Item]] = {}
        for item in self.items:
            groups.setdefault(item.benchmark, []).append(item)
        self._groups = list(groups.values()) if self.mix == "balanced" else [list(self.items)]

    def next_batch(self, n: int) -> list[Item]:
        out = []
        for _ in range(n):
            turn, k = divmod(self.cursor, len(self._groups))
            group = self._groups[k]
            epoch, pos = divmod(turn, len(group))
            # pooled keeps its historical stream (seed + epoch); balanced seeds each benchmark apart
            stream = self.seed + epoch if self.mix == "pooled" else [self.seed, k, epoch]
            order = np.random.default_rng(stream).permutation(len(group))
            out.append(group[int(order[pos])])
            self.cursor += 1
        return out


@dataclass
class StepResult:
    step: int
    metrics: dict[str, float]
    episodes: list[Episode] = field(default_factory=list)


def noop_reason(m: dict[str, float]) -> str | None:
    """Why this step's update could not change the policy, or None: every advantage group had zero
    spread (all its episodes rewarded alike, so every advantage is 0), every ratio was clipped, or
    the gradient was zero. The tiny model's smoke run is such a run: its replies all hit the cap, so
    both episodes of the one question earn the same reward."""
    groups, zero = int(m.get("train/adv_groups", 0)), int(m.get("train/zero_adv_groups", 0))
    if groups and zero >= groups:
        return f"all {groups} advantage group{'s' * (groups != 1)} zero"
    if m.get("gspo/clip_frac_low", 0.0) + m.get("gspo/clip_frac_high", 0.0) >= 1.0 - 1e-9:
        return "every ratio clipped"
    if m.get("gspo/grad_norm") == 0.0:
        return "zero gradient"
    return None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class GSPOTrainer:
    """Runs GSPO steps: an environment plays episodes, a training engine updates the policy.

    Args:
        cfg: the validated config.
        engine: a :class:`PolicyEngine` (``engine.module`` is the HF policy the environment generates with).
        env: an :class:`Environment` over ``engine.module`` (anything with
            ``play(items, group_size, seed=) -> graded episodes``).
        items: training questions.
        dist: this process's rank and the all-gather (:class:`Ranks`; the runtime's ``DistInfo``).
        pad_id: tokenizer pad id for packing.
    """

    def __init__(self, cfg: Config, engine: PolicyEngine, env: Environment, items: Sequence[Item], dist: Ranks,
                 pad_id: int) -> None:
        if not items:
            raise ValueError("no training questions: check data.train_sources and run `agent-gspo prepare`")
        problem = rank_split_problem(cfg, dist.world_size)
        if problem:  # the launcher's world size (the config check covers only launches it configures)
            raise UserError(f"{problem}; the world size here is WORLD_SIZE={dist.world_size} (set by the launcher)")
        self.cfg, self.engine, self.env, self.dist, self.pad_id = cfg, engine, env, dist, pad_id
        self.sampler = QuestionSampler(items, cfg.gspo.seed, mix=cfg.data.train_mix)
        self.controller = DualBudgetController.from_config(cfg.budget, cfg.reward)
        self.loss_fn = get_policy_loss(cfg.gspo.level)
        self.loss_settings = LossSettings.of(cfg.gspo)
        self.step_idx = 0
        self.history: list[dict[str, float]] = []
        self.temperature = cfg.mas.temperature if cfg.mas.temperature > 0 else 1.0
        self.silence_id: int | None = getattr(getattr(env, "engine", None), "silence_id", None)
        # where the sampler masked silence: from the 2nd token in a team, everywhere for a lone agent
        self.silence_from = 1 if getattr(getattr(env, "engine", None), "silence_first", True) else 0
        """masked after a reply's first token by the decoder, so the trainer masks it too"""
        self.first_banned = getattr(getattr(env, "engine", None), "first_banned", None)
        """[V] bool: what ``mas.must_answer``'s speaker could not start with (the decoder's mask)"""
        self.sampling = Sampling(self.temperature, self.silence_id, self.silence_from, self.first_banned)
        """how the decoder sampled: the log-probs are recomputed under the same masks"""
        self.ref_model = self._reference_model() if self._wants_reference() else None
        self._last_kl_base: dict[str, float] = {}
        self.budget_calibration: dict[str, float | str] | None = None
        """how B was set when ``budget.fraction`` is used (see :meth:`calibrate_budget`)"""

    def _wants_reference(self) -> bool:
        """The base policy is needed for the KL penalty, or to log the KL from it (never a copy of a
        ZeRO-3-partitioned module: then only LoRA, whose base is the adapters-off view, logs it)."""
        g, zero3 = self.cfg.gspo, self.cfg.gspo.engine == "deepspeed" and self.cfg.deepspeed.zero_stage == 3
        return g.kl_beta > 0 or (g.log_kl_base and (has_adapters(self.engine.module) or not zero3))

    def _reference_model(self) -> torch.nn.Module | None:
        """Frozen reference for the KL term: the base model with adapters off under LoRA (None
        here means "use disabled_adapters"), else a frozen copy of the initial policy."""
        if has_adapters(self.engine.module):
            return None
        ref = copy.deepcopy(self.engine.module).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    def _ref_logprobs(self, batch: SequenceBatch, needed: bool | None = None) -> torch.Tensor | None:
        if not (self.cfg.gspo.kl_beta > 0 if needed is None else needed):
            return None
        if self.ref_model is not None:
            return self._logprobs(self.ref_model, batch)
        with disabled_adapters(self.engine.module) as base:
            return self._logprobs(base, batch)

    def _logprobs(self, model: torch.nn.Module, batch: SequenceBatch) -> torch.Tensor:
        """[B, C] completion log-probs of ``batch`` under ``model``, masked as the sampler masked them
        (silence only first; the banned first ids of rows that had to speak)."""
        return completion_logprobs(model, batch, self.sampling, share_prompts=self.cfg.gspo.share_prompts)

    @property
    def device(self) -> torch.device:
        return next(self.engine.module.parameters()).device

    def state(self) -> dict[str, Any]:
        """Everything of the algorithm besides weights/optimizer/RNG that a resumed run needs (the
        runtime adds the config hashes it checks on resume: :func:`components.runtime.resume.config_fields`)."""
        return {"step": self.step_idx, "cursor": self.sampler.cursor, "controller": self.controller.state_dict(),
                "history": self.history, "budget_calibration": self.budget_calibration}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state` (the runtime checked the checkpoint's config first)."""
        self.step_idx = int(state["step"])
        self.sampler.cursor = int(state["cursor"])
        self.controller.load_state_dict(state["controller"])
        self.history = list(state.get("history", []))
        self.budget_calibration = state.get("budget_calibration")

    def _my_questions(self) -> list[Item]:
        batch = self.sampler.next_batch(self.cfg.gspo.questions_per_step)
        return batch[self.dist.rank:: self.dist.world_size]

    def _old_logprobs(self, batch: StepBatch, micro: list[list[torch.Tensor]]) -> torch.Tensor:
        """π_old [M, C], before any update, on exactly the micro-batches the updates score: same rows,
        same shapes, so π_θ / π_old is 1 up to the update alone (in bf16 a forward of another batch
        shape differs by more than the clip range). The first mini-batch's own forward IS π_old (the
        loss detaches it): only mini-batches 2..μ need this pass."""
        seqs = batch.sequences
        old = torch.zeros_like(seqs.completion_mask)
        for rows in (m.to(self.device) for part in micro[1:] for m in part):
            old[rows] = self._logprobs(self.engine.module, seqs.select(rows))
        return old

    def calibrate_budget(self, fraction: float, questions: int) -> float:
        """B = ``fraction`` x the mean tokens per episode (``reward.token_measure``, all ranks) of the
        CURRENT policy sampling ``questions`` x G training episodes: the same measure, sampling and
        question distribution the dual controller then tracks. Questions come from their own seeded
        stream, so training sees the same questions with or without calibration. Returns that mean."""
        g, cfg = self.cfg.gspo, self.cfg
        sampler = QuestionSampler(self.sampler.items, g.seed + 104_729, mix=self.sampler.mix)
        mine = sampler.next_batch(questions)[self.dist.rank:: self.dist.world_size]
        self.engine.eval()
        with torch.no_grad(), self.engine.gathered_parameters():
            episodes = self.env.play(mine, g.group_size, seed=g.seed * 100_003 - 1)
        tokens = [float(e.tokens(cfg.reward.token_measure)) for e in episodes]
        tokens = [t for part in self.dist.all_gather(tokens) for t in part]
        mean = float(np.mean(tokens)) if tokens else 0.0
        self.controller.set_target(fraction * mean)
        self.budget_calibration = {"untrained_mean": mean, "fraction": fraction, "target": self.controller.target,
                                   "episodes": float(len(tokens)), "measure": cfg.reward.token_measure}
        return mean

    def _kl_from_base(self, batch: StepBatch, micro: list[list[torch.Tensor]], old_logp: torch.Tensor,
                      ref_logp: torch.Tensor | None, rows: int = 16) -> dict[str, float]:
        """``gspo/kl_base``: mean per-token k3 estimate of KL(π_old ‖ π_base) on ``rows`` messages
        (before this step's updates): how far training has moved the policy. The messages are taken
        from mini-batches 2..μ, whose π_old is already computed, and the base log-probs come from
        ``ref_logp`` when the KL penalty computed them: at most one extra forward, often none."""
        if not self._wants_reference() or not self.cfg.gspo.log_kl_base:
            return {}
        later = [m for part in micro[1:] for m in part]
        idx = torch.cat(later if later else micro[0])[:rows].to(self.device)
        sub = batch.sequences.select(idx)
        logp = old_logp[idx] if later else self._logprobs(self.engine.module, sub)
        base = ref_logp[idx] if ref_logp is not None else self._ref_logprobs(sub, needed=True)
        assert base is not None
        d = (base - logp) * sub.completion_mask
        k3 = (torch.exp(d) - d - 1.0) * sub.completion_mask
        return {"gspo/kl_base": float(k3.sum() / sub.completion_mask.sum().clamp(min=1.0))}

    def _update(self, batch: StepBatch) -> tuple[list[dict[str, float]], list[float]]:
        """μ optimizer updates, one per mini-batch; each mini-batch is ``gspo.grad_accum`` micro-batches
        weighted by their rows, so an update equals the full mini-batch's update."""
        g, seqs = self.cfg.gspo, batch.sequences
        gen = torch.Generator().manual_seed(g.seed * 7919 + self.step_idx)
        parts = minibatch_indices(len(batch.messages), g.minibatches, gen)
        micro = [[m for m in torch.tensor_split(idx, g.grad_accum) if m.numel()] for idx in parts]
        with torch.no_grad():
            old_logp = self._old_logprobs(batch, micro)
            ref_logp = None
            if g.kl_beta > 0:  # per micro-batch too: the same shapes as the policy's forwards
                ref_logp = torch.zeros_like(seqs.completion_mask)
                for rows in (m.to(self.device) for part in micro for m in part):
                    ref_logp[rows] = self._ref_logprobs(seqs.select(rows))
            self._last_kl_base = self._kl_from_base(batch, micro, old_logp, ref_logp)
        self.engine.train()
        loss_metrics: list[dict[str, float]] = []
        grad_norms: list[float] = []
        progress = leaf("update", len(micro), "mini-batches")
        for k, part in enumerate(micro):

            def micro_loss(rows: torch.Tensor, first: bool = k == 0) -> torch.Tensor:
                rows = rows.to(self.device)
                sub = seqs.select(rows)
                logp = self._logprobs(self.engine.module, sub)
                out: LossOutput = self.loss_fn(
                    logp, logp.detach() if first else old_logp[rows], batch.advantages[rows], sub.completion_mask,
                    self.loss_settings, None if ref_logp is None else ref_logp[rows])
                loss_metrics.append(out.metrics | {"gspo/loss": float(out.loss.detach())})
                return out.loss

            grad_norms.append(self.engine.update([(int(m.numel()), lambda m=m: micro_loss(m)) for m in part]))
            progress.advance()
        return loss_metrics, grad_norms

    def _all_ranks(self, local: dict[str, float], tokens: int, rollout_s: float,
                   peaks: dict[str, float]) -> dict[str, float]:
        """This rank's loss metrics as all-rank means, the rollout throughput of all ranks (their
        tokens over the slowest rank's rollout time) and the peak memory of the most loaded rank
        (what decides whether a node runs out): one all-gather; every rank returns the same."""
        parts = self.dist.all_gather((local, tokens, rollout_s, peaks))
        out = {k: float(np.mean([p[0][k] for p in parts])) for k in local}
        out["perf/rollout_tokens_per_s"] = sum(p[1] for p in parts) / max(max(p[2] for p in parts), 1e-9)
        out |= {k: max(p[3].get(k, 0.0) for p in parts) for k in peaks}
        return out

    def train_step(self) -> StepResult:
        """Play → reward → batch (one gather) → μ updates → dual ascent → metrics."""
        cfg, g = self.cfg, self.cfg.gspo
        t0 = time.perf_counter()
        peaks = PhasePeaks(self.device)  # this rank's peak memory in each phase (logged: the largest rank's)
        self.engine.eval()
        with peaks.phase("rollout"), torch.no_grad(), self.engine.gathered_parameters():
            episodes = self.env.play(self._my_questions(), g.group_size, seed=g.seed * 100_003 + self.step_idx)
        t_roll = time.perf_counter() - t0
        lam = self.controller.lambda_tok
        apply_rewards(episodes, cfg.reward, lam)
        batch = StepBatch.build(episodes, cfg, self.dist, lam, self.pad_id, self.device)
        with peaks.phase("update"):
            loss_metrics, grad_norms = self._update(batch)
        if cfg.budget.enabled:
            self.controller.update(batch.mean_tokens)
        local = self._last_kl_base | {k: float(np.mean([m[k] for m in loss_metrics])) for k in loss_metrics[0]}
        metrics = dict(batch.metrics) | self._all_ranks(local, sum(m.completion_tokens for m in batch.messages), t_roll,
                                                        peaks.metrics())
        metrics |= {"gspo/grad_norm": float(np.mean(grad_norms)), "train/lambda_tok": lam,
                    "train/budget": self.controller.target, "perf/step_s": time.perf_counter() - t0}
        groups = metrics.get("train/adv_groups", 0.0)
        metrics["gspo/zero_adv_groups_frac"] = metrics.get("train/zero_adv_groups", 0.0) / groups if groups else 1.0
        metrics["gspo/noop_step"] = float(noop_reason(metrics) is not None)
        self.step_idx += 1
        self.history.append({"step": float(self.step_idx)} | metrics)
        return StepResult(self.step_idx, metrics, episodes)
