"""The registered model at run time: the trained multi-agent system, not the bare language model.

A registered version holds the policy folder (weights + tokenizer) and :data:`SETTINGS_FILE`,
the ``mas`` / ``reward`` / model settings the policy was trained with. :class:`ServedSystem`
loads both and answers each question the way the system was trained to: N agents sharing the
policy talk for T rounds under the recorded protocol, and the final answer is aggregated as in
training. It returns the answer, the full transcript (every agent and round, silent turns
included) and the token counts. ``mlflow.pyfunc.load_model`` and ``mlflow models serve`` reach
it through :mod:`components.tracking.hf_pyfunc`.

Request params (the model signature lists them with the trained values as defaults):
``agents``, ``rounds``, ``max_new_tokens`` (per message), ``temperature`` (0 = greedy, the
default; > 0 samples with ``seed``) and ``seed``. A sampled row's answer depends only on that
row, the params and the seed, not on the other rows of the request (sampled rows run one at a time:
in one batch they would share a random stream; greedy rows are batched). A value the configuration schema refuses
(``agents=0``, ``rounds=9``, ``temperature=3``), a seed outside 0..2**32-1, a ``max_new_tokens``
or a question that does not fit the model's context, a null question, too many rows or choices
are refused before anything is generated, with a message naming the field
(:mod:`components.tracking.served_inputs`; HTTP 400 when served). Note that MLflow itself drops
params outside the signature, with a warning in the server log.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.config import Config, MasConfig
from components.mas.voting import vote
from components.scoring.grader import extract
from components.tracking.served_inputs import (
    ANSWER_TYPES,
    DEFAULT_ANSWER_TYPE,
    RequestError,
    RequestLimits,
    check_seed,
    check_temperature,
    model_window,
    request_items,
)

__all__ = ["ANSWER_TYPES", "DEFAULT_ANSWER_TYPE", "SETTINGS_FILE", "RequestError", "ServedSystem", "read_settings",
           "run_rollout", "system_settings"]

SETTINGS_FILE = "agent_gspo_system.json"
SETTINGS_FORMAT = 1
PARAM_KEYS = {"agents": "agents", "rounds": "rounds", "max_new_tokens": "max_message_tokens"}
"""request param -> ``mas`` key it overrides (``temperature`` and ``seed`` are handled apart)"""


def system_settings(cfg: Config, *, git_commit: str | None = None) -> dict[str, Any]:
    """What a registered version records about how its policy was trained."""
    return {"format": SETTINGS_FORMAT, "mas": cfg.mas.model_dump(mode="json"),
            "reward": cfg.reward.model_dump(mode="json"),
            "model": {"base": cfg.model.name, "dtype": cfg.model.dtype},
            "config_sha256": cfg.hash(), "profile": cfg.profile, "git_commit": git_commit}


def read_settings(path: str | Path) -> dict[str, Any]:
    """Read and check :data:`SETTINGS_FILE`; the ``mas`` section must validate against today's schema."""
    doc = json.loads(Path(path).read_text())
    if doc.get("format") != SETTINGS_FORMAT:
        raise RequestError(f"{path}: settings format {doc.get('format')!r}, expected {SETTINGS_FORMAT}")
    MasConfig.model_validate(doc["mas"])
    return doc


def run_rollout(system: ServedSystem, mas: MasConfig, items: list[Any], *, seed: int, greedy: bool) -> list[Any]:
    """One episode per item, as in training and evaluation: the rollout engine, then the team's vote.

    The only place the served model touches the engine: a change of the engine's API is adapted
    here. There is no gold answer, so nothing is graded. Returns ``Episode`` objects in item order.
    """
    from components.mas.engine import RolloutEngine  # lazy: torch (promote reads the settings without it)

    engine = RolloutEngine(system.model, system.tokenizer, mas, device=system.device)
    episodes = engine.rollout(items, 1, seed=seed, greedy=greedy)
    vote(episodes, items, mas)
    return episodes


def _response(ep: Any, answer: str | None) -> dict[str, Any]:
    transcript = [{"agent": m.agent_id, "role": m.role, "round": m.round, "silent": bool(m.silent),
                   "text": m.text, "prompt_tokens": m.prompt_tokens, "completion_tokens": m.completion_tokens,
                   "recipients": list(m.recipients)} for m in ep.messages]
    return {"answer": answer, "final_text": ep.final_answer, "transcript": transcript,
            "prompt_tokens": ep.prompt_tokens, "completion_tokens": ep.completion_tokens,
            "communicated_tokens": ep.communicated_tokens, "total_tokens": ep.total_tokens,
            "turns": ep.turns, "messages": len(ep.messages)}


@dataclass
class ServedSystem:
    """The policy, its tokenizer and its recorded settings, ready to answer questions."""

    model: Any
    tokenizer: Any
    settings: dict[str, Any]
    device: str = "cpu"

    @classmethod
    def load(cls, policy_dir: str | Path, settings_path: str | Path) -> ServedSystem:
        import torch

        from components.models import load_policy

        settings = read_settings(settings_path)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model, tokenizer = load_policy(str(policy_dir), dtype=settings["model"].get("dtype", "auto"), device=device,
                                       silence_marker=settings["mas"]["silence_marker"])
        return cls(model.eval(), tokenizer, settings, device)

    @property
    def window(self) -> int | None:
        """Tokens the model holds (prompt + reply), or None when it declares no context length."""
        return model_window(self.model, self.tokenizer)

    def mas_for(self, params: dict[str, Any] | None) -> tuple[MasConfig, bool, int]:
        """The trained ``mas`` settings with the request's params applied and validated."""
        mas, greedy, seed, _ = self._request(params)
        return mas, greedy, seed

    def _request(self, params: dict[str, Any] | None) -> tuple[MasConfig, bool, int, RequestLimits]:
        from pydantic import ValidationError

        params = dict(params or {})
        mas = dict(self.settings["mas"])
        for key, target in PARAM_KEYS.items():
            if params.get(key) is not None:
                mas[target] = params[key]
        temperature = check_temperature(params.get("temperature"))
        if temperature:
            mas["temperature"] = temperature
        seed = check_seed(params.get("seed"))
        try:
            cfg = MasConfig.model_validate(mas)
        except ValidationError as exc:
            names = {v: k for k, v in PARAM_KEYS.items()} | {"temperature": "temperature"}
            parts = [f"{names.get(str(e['loc'][0]), e['loc'][0]) if e['loc'] else 'params'}="
                     f"{str(repr(e.get('input')))[:60]}: {e['msg']}" for e in exc.errors()]
            raise RequestError("invalid params: " + "; ".join(parts)) from None
        limits = RequestLimits(self.tokenizer, cfg, self.window)
        limits.check_reply()
        return cfg, temperature == 0.0, seed, limits

    def answer(self, records: list[dict[str, Any]], params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Answer each row (``{"question", "answer_type"?, "choices"?}``); see the module docstring.

        Every row and param is checked before anything is generated."""
        mas, greedy, seed, limits = self._request(params)
        items = request_items(records, limits)
        if not items:
            return []
        if greedy:  # one batched rollout: a greedy row's answer does not depend on the other rows
            episodes = run_rollout(self, mas, items, seed=seed, greedy=True)
        else:  # sampled rows share one random stream in a batch: one rollout per row, each from `seed`
            episodes = [ep for item in items for ep in run_rollout(self, mas, [item], seed=seed, greedy=False)]
        return [_response(ep, extract(item, ep.final_answer) if ep.final_answer else None)
                for item, ep in zip(items, episodes, strict=True)]
