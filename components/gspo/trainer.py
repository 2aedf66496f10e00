"""The Agent-GSPO training loop (one readable file, cleanRL style).

One step:
  1. take the next ``questions_per_step`` training questions (deterministic cursor, reshuffled
     per epoch by the seed) and keep this rank's shard;
  2. roll out G multi-agent episodes per question with the current policy;
  3. reward every episode with the current λ_tok; gather (question, reward) from all ranks and
     group-normalise advantages (per question, or per question×agent×round);
  4. recompute the old log-probs once (π_old = the policy before this step's updates);
  5. μ mini-batch updates with the GSPO loss (off-policy after the first, so clipping acts);
  6. dual ascent on λ_tok with the global mean token use; metrics; checkpoint.

The trainer is engine-agnostic (``TrainEngine``: DeepSpeed or torch) and distributed-agnostic
(world size 1 is the ordinary case). Everything is driven by the typed :class:`Config`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from components.config import Config
from components.gspo.advantages import group_advantages, make_group_ids
from components.gspo.batching import completion_logprobs, minibatch_indices, pack_messages
from components.gspo.distributed import DistInfo, all_gather_objects
from components.gspo.loss import gspo_loss
from components.mas.records import Episode, Message
from components.reward.budget import DualBudgetController
from components.reward.reward import apply_rewards, message_rewards

MetricSink = Callable[[dict[str, float], int], None]


@dataclass
class QuestionSampler:
    """Deterministic pass over the training items: shuffled per epoch with ``seed + epoch``.

    ``cursor`` counts items handed out so far; it is saved with every checkpoint so a resumed
    run draws exactly the questions an uninterrupted run would.
    """

    items: Sequence[dict[str, Any]]
    seed: int
    cursor: int = 0

    def next_batch(self, n: int) -> list[dict[str, Any]]:
        out = []
        for _ in range(n):
            epoch, pos = divmod(self.cursor, len(self.items))
            order = np.random.default_rng(self.seed + epoch).permutation(len(self.items))
            out.append(self.items[int(order[pos])])
            self.cursor += 1
        return out


@dataclass
class StepResult:
    step: int
    metrics: dict[str, float]
    episodes: list[Episode] = field(default_factory=list)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _message_advantages(episodes: list[Episode], cfg: Config, dist: DistInfo,
                        lambda_tok: float) -> tuple[list[Message], torch.Tensor, dict[str, float]]:
    """Flatten local episodes into messages with their advantages (global group statistics).

    Rewards of every rank are gathered first so a group split across ranks is normalised over
    all its members. With ``per_agent_credit`` each message carries its own shaped reward.
    """
    local: list[tuple[str, int, int, float]] = []  # (question, agent, round, reward) per message
    messages: list[Message] = []
    for ep in episodes:
        rewards = (message_rewards(ep, cfg.reward, lambda_tok) if cfg.reward.per_agent_credit
                   else [ep.reward] * len(ep.messages))
        for m, r in zip(ep.messages, rewards, strict=True):
            local.append((ep.question_id, m.agent_id, m.round, float(r)))
            messages.append(m)
    gathered = all_gather_objects(local) if dist.world_size > 1 else [local]
    rows = [row for part in gathered for row in part]
    offset = sum(len(part) for part in gathered[: dist.rank])
    keys: list[Sequence[Any]] = [[r[0] for r in rows]]
    if cfg.gspo.group_by_agent_round:
        keys += [[r[1] for r in rows], [r[2] for r in rows]]
    rewards = torch.tensor([r[3] for r in rows], dtype=torch.float32)
    adv = group_advantages(rewards, make_group_ids(*keys), mode=cfg.gspo.adv_norm,
                           std_floor=cfg.gspo.adv_std_floor)
    mine = adv.advantages[offset: offset + len(local)]
    stats = {"train/zero_adv_groups": float(adv.zero_spread_groups), "train/adv_groups": float(adv.n_groups)}
    return messages, mine, stats


def episode_metrics(episodes: list[Episode], prefix: str = "train") -> dict[str, float]:
    """Means over episodes under the contract metric names."""
    if not episodes:
        return {}
    n = len(episodes)

    def mean(f: Callable[[Episode], float]) -> float:
        return float(sum(f(e) for e in episodes) / n)

    return {
        f"{prefix}/reward": mean(lambda e: e.reward),
        f"{prefix}/accuracy": mean(lambda e: float(e.correct)),
        f"{prefix}/tokens_total": mean(lambda e: e.total_tokens),
        f"{prefix}/tokens_completion": mean(lambda e: e.completion_tokens),
        f"{prefix}/tokens_communicated": mean(lambda e: e.communicated_tokens),
        f"{prefix}/turns": mean(lambda e: e.turns),
        f"{prefix}/repetition": mean(lambda e: e.repetition),
        f"{prefix}/silence_rate": mean(lambda e: e.silence_rate),
    }


def silence_by_agent_round(episodes: list[Episode]) -> dict[str, float]:
    """``silence/agent{a}_round{r}`` rates, for the silence-per-agent-and-round plot."""
    counts: dict[tuple[int, int], list[int]] = {}
    for ep in episodes:
        for m in ep.messages:
            c = counts.setdefault((m.agent_id, m.round), [0, 0])
            c[0] += int(m.silent)
            c[1] += 1
    return {f"silence/agent{a}_round{r}": s / max(1, t) for (a, r), (s, t) in sorted(counts.items())}


class GSPOTrainer:
    """Runs GSPO steps on a rollout engine and a training engine.

    Args:
        cfg: the validated config.
        engine: a ``TrainEngine`` (``engine.module`` is the HF policy used for generation).
        rollout: a ``RolloutEngine`` over ``engine.module``.
        items: training questions (normalised records).
        dist: this process's rank info.
        pad_id: tokenizer pad id for packing.
    """

    def __init__(self, cfg: Config, engine: Any, rollout: Any, items: Sequence[dict[str, Any]],
                 dist: DistInfo, pad_id: int) -> None:
        if not items:
            raise ValueError("no training questions: check data.train_sources and run `agent-gspo prepare`")
        self.cfg, self.engine, self.rollout, self.dist, self.pad_id = cfg, engine, rollout, dist, pad_id
        self.sampler = QuestionSampler(items, cfg.gspo.seed)
        self.controller = DualBudgetController.from_config(cfg.budget, cfg.reward)
        self.step_idx = 0
        self.history: list[dict[str, float]] = []
        self.temperature = cfg.mas.temperature if cfg.mas.temperature > 0 else 1.0
        self.ref_model = self._reference_model() if cfg.gspo.kl_beta > 0 else None

    def _reference_model(self) -> torch.nn.Module | None:
        """Frozen reference for the KL term: the base model with adapters off under LoRA (None
        here means "use disabled_adapters"), else a frozen copy of the initial policy."""
        import copy

        from components.models.lora import has_adapters

        if has_adapters(self.engine.module):
            return None
        ref = copy.deepcopy(self.engine.module).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    def _ref_logprobs(self, batch: Any) -> torch.Tensor | None:
        if self.cfg.gspo.kl_beta <= 0:
            return None
        if self.ref_model is not None:
            return completion_logprobs(self.ref_model, batch, self.temperature)
        from components.models.lora import disabled_adapters

        with disabled_adapters(self.engine.module) as base:
            return completion_logprobs(base, batch, self.temperature)

    @property
    def device(self) -> torch.device:
        return next(self.engine.module.parameters()).device

    def state(self) -> dict[str, Any]:
        """Everything besides weights/optimizer/RNG that a resumed run needs."""
        return {"step": self.step_idx, "cursor": self.sampler.cursor, "controller": self.controller.state_dict(),
                "history": self.history, "config_hash": self.cfg.hash()}

    def load_state(self, state: dict[str, Any]) -> None:
        if state.get("config_hash") not in (None, self.cfg.hash()):
            from components.errors import UserError

            raise UserError("checkpoint was written with a different config (config hash differs); "
                            "resume with the same params/profile or start a fresh --out folder")
        self.step_idx = int(state["step"])
        self.sampler.cursor = int(state["cursor"])
        self.controller.load_state_dict(state["controller"])
        self.history = list(state.get("history", []))

    def _my_questions(self) -> list[dict[str, Any]]:
        batch = self.sampler.next_batch(self.cfg.gspo.questions_per_step)
        return batch[self.dist.rank:: self.dist.world_size]

    def train_step(self) -> StepResult:
        cfg, g = self.cfg, self.cfg.gspo
        t0 = time.perf_counter()
        questions = self._my_questions()
        self.engine.eval()
        with torch.no_grad(), self.engine.gathered_parameters():
            episodes = self.rollout.rollout(questions, g.group_size, seed=g.seed * 100_003 + self.step_idx)
        t_roll = time.perf_counter() - t0
        lam = self.controller.lambda_tok
        apply_rewards(episodes, cfg.reward, lam)
        messages, adv, adv_stats = _message_advantages(episodes, cfg, self.dist, lam)
        batch = pack_messages(messages, self.pad_id).to(self.device)
        adv = adv.to(self.device)
        gen = torch.Generator().manual_seed(g.seed * 7919 + self.step_idx)
        parts = minibatch_indices(len(messages), g.minibatches, gen)
        # π_old, recomputed once. The first mini-batch is scored before any update, so its own
        # forward IS π_old (detached below): only the later mini-batches' rows need the extra pass.
        old_logp = torch.zeros_like(batch.completion_mask)
        with torch.no_grad():
            if len(parts) > 1:
                later = torch.cat(parts[1:]).to(self.device)
                old_logp[later] = completion_logprobs(self.engine.module, batch.select(later), self.temperature)
            ref_logp = self._ref_logprobs(batch)
        self.engine.train()
        loss_metrics: list[dict[str, float]] = []
        grad_norms: list[float] = []
        for k, idx in enumerate(parts):
            # grad_accum micro-batches per optimizer update (the engine divides each loss by it)
            for micro in torch.tensor_split(idx, g.grad_accum):
                empty = micro.numel() == 0
                micro = idx[:1] if empty else micro
                sub = batch.select(micro)
                logp = completion_logprobs(self.engine.module, sub, self.temperature)
                old = logp.detach() if k == 0 else old_logp[micro.to(self.device)]
                out = gspo_loss(logp, old, adv[micro.to(self.device)], sub.completion_mask,
                                eps_low=g.eps_low, eps_high=g.eps_high, level=g.level,
                                ref_logp=None if ref_logp is None else ref_logp[micro], kl_beta=g.kl_beta)
                self.engine.backward(out.loss * 0.0 if empty else out.loss)
                if not empty:
                    loss_metrics.append(out.metrics | {"gspo/loss": float(out.loss.detach())})
            grad_norms.append(float(self.engine.step()))
            self.engine.zero_grad()
        # global episode statistics drive the dual update and the logged metrics
        tokens = [float(e.tokens(cfg.reward.token_measure)) for e in episodes]
        if self.dist.world_size > 1:
            tokens = [t for part in all_gather_objects(tokens) for t in part]
        mean_tokens = float(np.mean(tokens)) if tokens else 0.0
        metrics = episode_metrics(episodes)
        metrics.update({k: float(np.mean([m[k] for m in loss_metrics])) for k in loss_metrics[0]})
        metrics.update(adv_stats)
        metrics["gspo/grad_norm"] = float(np.mean(grad_norms))
        metrics["train/lambda_tok"] = lam
        metrics["train/budget"] = self.controller.target
        metrics["train/budget_tokens"] = mean_tokens
        if cfg.budget.enabled:
            self.controller.update(mean_tokens)
        gen_tokens = sum(m.completion_tokens for m in messages)
        metrics["perf/rollout_tokens_per_s"] = gen_tokens / max(t_roll, 1e-9)
        metrics["perf/step_s"] = time.perf_counter() - t0
        metrics.update(silence_by_agent_round(episodes))
        self.step_idx += 1
        self.history.append({"step": float(self.step_idx)} | metrics)
        return StepResult(self.step_idx, metrics, episodes)

