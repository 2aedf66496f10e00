"""A small, controllable multi-agent environment for the learning-proof tests.

The policy is the tiny random Llama (``components.models.tiny``); the task is defined by the
environment, not by the model's (gibberish) text:

* ``helper_agent`` is the only agent whose messages matter: the team succeeds when it speaks
  (is not silent) in the first round; every other agent's messages never help.
* The reward is the project's communication-aware reward on *completion* tokens, so every
  generated token costs λ_tok / B_norm whatever the topology.

Exploration: a random 500-token-vocabulary model almost never emits the silence marker first
(p ≈ 0.2 %), so with a CPU-sized batch the test would wait thousands of samples to see one.
:func:`set_marker_prior` shifts the marker's output row so the *initial* policy stays silent
about 4 % of the time — like a real instruct model told it may reply ``<silent>`` — and the
test then checks that training, not the prior, drives silence above 50 %.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from components.config import Config, load_config
from components.data.item import Item
from components.gspo.trainer import GSPOTrainer, seed_everything
from components.mas.engine import RolloutEngine
from components.mas.environment import Environment
from components.models.tiny import SILENCE_MARKER, build_tiny_model
from components.runtime.distributed import DistInfo
from components.runtime.engines import build_engine, planned_updates
from components.scoring.result import ScoreResult

ITEMS = [Item(id=f"toy/{i}", benchmark="gsm8k", split="train", question=f"What is {i} plus {i}?", answer=str(2 * i),
              answer_type="numeric") for i in range(16)]


def helper_judge(helper_agent: int):
    """Success = the helper agent spoke in round 0."""

    def judge(items: list, episodes: list) -> None:
        for ep in episodes:
            ok = any(m.agent_id == helper_agent and m.round == 0 and not m.silent for m in ep.messages)
            ep.grade = ScoreResult(ok, None, None)
    return judge


def talk_threshold(question_id: str, max_useful: int) -> float:
    """Tokens a question needs: ``max_useful · u²`` with u uniform in [0, 1) from the id's sha256."""
    u = int.from_bytes(hashlib.sha256(question_id.encode()).digest()[:8], "big") / 2**64
    return max_useful * u * u


def talk_judge(max_useful: int):
    """Talking helps, with diminishing returns: an episode succeeds when its agents' non-silent
    completion tokens reach the question's threshold (:func:`talk_threshold`). Over questions,
    P(success | s tokens spoken) = sqrt(min(1, s / max_useful)): the first tokens are worth the most,
    so the best token use depends on λ_tok. Without a penalty the policy talks as much as it can,
    and only the dual budget can hold it at a target in between.
    """

    def judge(items: list, episodes: list) -> None:
        for ep in episodes:
            spoken = sum(m.completion_tokens for m in ep.messages if not m.silent)
            first_ids = ",".join(str(m.completion_ids[0]) for m in ep.messages)
            u = int.from_bytes(hashlib.sha256(f"{ep.question_id}:{ep.group_index}:{first_ids}".encode()).digest()[:8],
                               "big") / 2**64
            ep.grade = ScoreResult(spoken >= max_useful * u * u, None, None)
    return judge


@torch.no_grad()
def set_marker_prior(model: torch.nn.Module, engine: RolloutEngine, items: list[dict], p: float = 0.04) -> None:
    """Set the marker's lm_head row so its first-token probability is about ``p`` on these prompts."""
    marker = engine.tok.convert_tokens_to_ids(SILENCE_MARKER)
    # the exact first-round prompts the agents see, taken from one rollout
    prompts = [m.prompt_ids for ep in engine.rollout(items, 1, seed=0) for m in ep.messages if m.round == 0]
    hidden, others = [], []
    for ids in prompts:
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        hidden.append(out.hidden_states[-1][0, -1])
        logits = out.logits[0, -1].clone()
        logits[marker] = float("-inf")
        others.append(torch.logsumexp(logits, 0))
    h = torch.stack(hidden)
    direction = h.mean(0) / h.mean(0).norm()
    target = torch.stack(others) + torch.log(torch.tensor(p / (1 - p)))
    scale = (target / (h @ direction)).mean()
    model.lm_head.weight[marker] = direction * scale


@dataclass
class LearningRun:
    trainer: GSPOTrainer
    task: Environment
    cfg: Config


def make_run(overrides: list[str], *, seed: int = 0, prior: float = 0.04, helper_agent: int = 0,
             task: str = "helper", dtype: torch.dtype = torch.float32) -> LearningRun:
    """A tiny GSPO run on the helper task; ``overrides`` are params.yaml keys; ``dtype``: the policy's."""
    base = ["model.name=tiny-random", "mas.agents=2", "mas.rounds=1", "mas.max_message_tokens=12",
            "mas.temperature=1.0", "gspo.engine=torch", "gspo.questions_per_step=4", "gspo.group_size=8",
            "gspo.minibatches=2", "gspo.lr=0.003",
            "reward.token_measure=completion", "reward.token_norm=12", "reward.lambda_turn=0",
            "reward.lambda_rep=0", f"gspo.seed={seed}"]
    cfg = load_config(overrides=base + overrides)
    seed_everything(seed)
    model, tok = build_tiny_model(seed)
    rollout = RolloutEngine(model, tok, cfg.mas)
    set_marker_prior(model, rollout, ITEMS, prior)
    model.to(dtype)
    engine = build_engine(model, cfg.gspo, cfg.deepspeed, total_steps=planned_updates(cfg.gspo))
    judge = (helper_judge(helper_agent) if task == "helper"
             else talk_judge(cfg.mas.agents * cfg.mas.max_message_tokens))
    env = Environment(rollout, judge)
    trainer = GSPOTrainer(cfg, engine, env, ITEMS, DistInfo(rank=0, world_size=1, local_rank=0, is_main=True),
                          pad_id=int(tok.pad_token_id))
    return LearningRun(trainer, env, cfg)


def agent_silence(episodes: list, agent: int) -> float:
    msgs = [m for ep in episodes for m in ep.messages if m.agent_id == agent]
    return sum(m.silent for m in msgs) / max(1, len(msgs))
