"""Dual (Lagrangian) budget controller for the token penalty λ_tok.

The constrained problem  max E[r_task − …]  s.t.  E[tokens] ≤ B  has the Lagrangian
E[r] − λ·(E[tokens]/B − 1). The policy (GSPO) ascends in θ; the controller does projected dual
ascent in λ after every rollout batch, with an optional proportional term (the PID Lagrangian of
Stooke et al., 2020, without the derivative):

    e   = mean_tokens / B − 1                          (the constraint violation, normalised by B)
    I  ← clip(I + η · e, λ_min, λ_max)                 (plain dual ascent: the integral term)
    λ   = clip(I + k_p · e, λ_min, λ_max)

so λ grows while the batch is over budget and decays (to λ_min) while it is under. With
``k_p = 0`` (the default) λ is the dual-ascent iterate itself. Pure integral control lags the
policy, so token use overshoots B and oscillates around it; the proportional term reacts to the
current error at once and damps that (measured in the README). The constraint is normalised by B
so that η and k_p do not depend on the size of the budget.

**Two modes.** ``cap`` (the default) is the inequality constraint above: λ ≥ λ_min ≥ 0, so a
policy that needs fewer tokens than B is left there (the constraint is slack, λ decays towards
λ_min and tokens may stay well under B). ``target`` is the equality constraint E[tokens] = B,
whose multiplier has no sign: λ ∈ [−λ_max, λ_max], and a negative λ turns the token penalty into
a bonus, so the controller also pushes token use *up* to B. Use it to steer length to a budget
from both sides (a fixed compute budget per episode); ``cap`` is what "spend at most B" means.

**Which tokens B counts:** B is a mean per *episode* under ``RewardConfig.token_measure``
(completion, communicated or total tokens, the same count the reward's token penalty uses), and
``mean_tokens`` passed to :meth:`DualBudgetController.update` is the mean of
``episode.tokens(cfg.token_measure)`` over the step's episodes of ALL ranks (the trainer takes it
from :class:`components.gspo.step_batch.StepBatch`), so every rank steers λ identically.
Hand-written: it is one line of arithmetic plus checkpointable state; no library offers it in a
form worth the dependency.
"""

from __future__ import annotations

import copy
from typing import Any

from components.config import BudgetConfig, RewardConfig
from components.errors import UserError
from components.numbers import finite_float

STATE_VERSION = 3
"""2 adds ``kp`` and ``integral``, 3 adds ``mode``; version-1 states (pure dual ascent) load with
k_p = 0, I = λ, and states before 3 load in mode ``cap``"""
MODES = ("cap", "target")


class BudgetError(UserError):
    """Bad controller settings, a bad observation, or a checkpoint state that does not fit."""


def _finite(name: str, value: float) -> float:
    return finite_float(value, name, BudgetError)


class DualBudgetController:
    """Steers λ_tok so that mean tokens per episode track the budget B (``target``).

    ``history`` holds one dict per :meth:`update`: ``step`` (1-based), ``mean_tokens``,
    ``budget``, ``lambda_used`` (λ the batch was rewarded with) and ``lambda`` (λ after the
    update, used for the next batch). With ``enabled=False`` λ stays at ``lambda_init`` but the
    history is still recorded (the ablation "fixed λ").
    """

    def __init__(self, budget: BudgetConfig, lambda_init: float) -> None:
        """``budget``: the ``budget`` section (its gains, bounds and mode); ``lambda_init``: λ's
        start (``reward.lambda_tok``). The values are checked here too: a checkpoint's state
        (:meth:`load_state_dict`) arrives as an unvalidated section."""
        target, lr, lambda_min, lambda_max, kp, mode = (budget.target, budget.lr, budget.lambda_min,
                                                         budget.lambda_max, budget.kp, budget.mode)
        if mode not in MODES:
            raise BudgetError(f"budget.mode: unknown {mode!r} (allowed: {', '.join(MODES)})")
        self.mode = mode
        self.target = _finite("budget.target", target)
        self.lr = _finite("budget.lr", lr)
        self.kp = _finite("budget.kp", kp)
        if self.kp < 0:
            raise BudgetError(f"budget.kp: the proportional gain must be >= 0 (got {kp!r})")
        self.lambda_min = _finite("budget.lambda_min", lambda_min)
        self.lambda_max = _finite("budget.lambda_max", lambda_max)
        lam = _finite("reward.lambda_tok", lambda_init)
        if self.target <= 0:
            raise BudgetError(f"budget.target: B must be > 0 tokens (got {target!r})")
        if self.lr <= 0:
            raise BudgetError(f"budget.lr: the dual step size must be > 0 (got {lr!r})")
        if not 0.0 <= self.lambda_min <= self.lambda_max:
            raise BudgetError(f"budget.lambda_min/lambda_max: need 0 <= lambda_min <= lambda_max "
                              f"(got {lambda_min!r}, {lambda_max!r})")
        if mode == "target" and self.lambda_min != 0.0:
            raise BudgetError(f"budget.lambda_min={lambda_min!r} applies to mode 'cap' only (mode 'target' bounds "
                              f"lambda_tok by [-lambda_max, lambda_max])")
        self.lower = -self.lambda_max if mode == "target" else self.lambda_min
        """λ's lower bound: λ_min in mode cap, −λ_max in mode target"""
        if not self.lower <= lam <= self.lambda_max:
            raise BudgetError(f"reward.lambda_tok: initial value {lambda_init!r} lies outside "
                              f"[{self.lower!r}, {lambda_max!r}] (budget mode {mode!r})")
        self.lambda_tok = lam
        self.integral = lam
        """the dual-ascent iterate I (equal to λ when k_p = 0)"""
        self.enabled = bool(budget.enabled)
        self.step = 0
        self.history: list[dict[str, float]] = []

    @classmethod
    def from_config(cls, budget: BudgetConfig, reward: RewardConfig) -> DualBudgetController:
        """Controller from ``budget.*`` with λ starting at ``reward.lambda_tok``."""
        return cls(budget, reward.lambda_tok)

    def update(self, mean_tokens: float) -> float:
        """One projected dual-ascent step from a batch's mean tokens per episode; returns the new λ."""
        m = _finite("mean_tokens", mean_tokens)
        if m < 0:
            raise BudgetError(f"mean_tokens must be >= 0 (got {mean_tokens!r})")
        used = self.lambda_tok
        if self.enabled:
            error = m / self.target - 1.0
            self.integral = self._clip(self.integral + self.lr * error)
            self.lambda_tok = self._clip(self.integral + self.kp * error)
        self.step += 1
        self.history.append({"step": self.step, "mean_tokens": m, "budget": self.target,
                             "lambda_used": used, "lambda": self.lambda_tok})
        return self.lambda_tok

    def set_target(self, target: float) -> None:
        """Set B (before the first update: a budget measured from the untrained policy)."""
        value = _finite("budget.target", target)
        if value <= 0:
            raise BudgetError(f"budget.target: B must be > 0 tokens (got {target!r})")
        self.target = value

    def _clip(self, value: float) -> float:
        return min(self.lambda_max, max(self.lower, value))

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state for checkpoints (floats round-trip exactly through JSON)."""
        return {"version": STATE_VERSION, "mode": self.mode, "target": self.target, "lr": self.lr, "kp": self.kp,
                "lambda_min": self.lambda_min, "lambda_max": self.lambda_max, "integral": self.integral,
                "lambda_tok": self.lambda_tok, "enabled": self.enabled, "step": self.step,
                "history": copy.deepcopy(self.history)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` exactly (the checkpoint's settings win over the constructor's)."""
        if not isinstance(state, dict):
            raise BudgetError(f"budget controller state must be a dict (got {type(state).__name__})")
        required = ("version", "target", "lr", "lambda_min", "lambda_max", "lambda_tok", "enabled", "step",
                    "history")
        missing = [k for k in required if k not in state]
        if missing:
            raise BudgetError(f"budget controller state: missing keys {missing}")
        if state["version"] not in range(1, STATE_VERSION + 1):
            raise BudgetError(f"budget controller state: version {state['version']!r} "
                              f"(this code reads 1 to {STATE_VERSION})")
        section = BudgetConfig.model_construct(  # unvalidated: the constructor's checks raise BudgetError
            target=state["target"], lr=state["lr"], lambda_min=state["lambda_min"], lambda_max=state["lambda_max"],
            enabled=state["enabled"], kp=state.get("kp", 0.0), mode=state.get("mode", "cap"))
        fresh = DualBudgetController(section, state["lambda_tok"])
        fresh.integral = _finite("integral", state.get("integral", state["lambda_tok"]))
        self.__dict__.update(fresh.__dict__)
        self.step = int(state["step"])
        self.history = copy.deepcopy(list(state["history"]))

    def __repr__(self) -> str:
        return (f"DualBudgetController(mode={self.mode!r}, target={self.target}, lr={self.lr}, kp={self.kp}, "
                f"lambda_tok={self.lambda_tok}, bounds=[{self.lower}, {self.lambda_max}], step={self.step}, "
                f"enabled={self.enabled})")
