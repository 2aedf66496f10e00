"""Dual budget controller: update rule, closed-loop tracking of B, bounds, checkpoint round-trip."""

from __future__ import annotations

import json
import math
import random

import pytest

from components.config import BudgetConfig, RewardConfig
from components.reward import BudgetError, DualBudgetController


def tokens_at(lam: float, rng: random.Random, noise: float = 10.0) -> float:
    """Synthetic environment: mean tokens per episode fall as λ rises (800 at λ=0, 400 at λ≈0.46)."""
    return max(0.0, 800.0 * math.exp(-1.5 * lam) + rng.gauss(0.0, noise))


def _ctrl(lambda_init: float, **budget: object) -> DualBudgetController:
    """A controller from ``budget.*`` values as given (unvalidated: its own checks are under test)."""
    return DualBudgetController(BudgetConfig.model_construct(**budget), lambda_init)


def run_loop(ctrl: DualBudgetController, steps: int, seed: int = 0, env=tokens_at) -> list[float]:
    rng = random.Random(seed)
    observed = []
    for _ in range(steps):
        m = env(ctrl.lambda_tok, rng)
        observed.append(m)
        ctrl.update(m)
    return observed


def test_update_rule_is_projected_dual_ascent():
    c = _ctrl(target=400.0, lr=0.1, lambda_init=0.2, lambda_min=0.0, lambda_max=1.0)
    assert c.update(600.0) == pytest.approx(0.2 + 0.1 * 0.5)       # over budget -> λ up
    assert c.update(200.0) == pytest.approx(0.25 - 0.1 * 0.5)      # under budget -> λ down
    assert c.update(400.0) == pytest.approx(0.2)                   # on budget -> unchanged
    c.update(0.0)
    c.update(0.0)
    c.update(0.0)
    assert c.lambda_tok == 0.0                                     # clipped at λ_min
    assert c.update(100_000.0) == 1.0                              # clipped at λ_max
    assert [h["step"] for h in c.history] == [1, 2, 3, 4, 5, 6, 7]
    assert c.history[0] == {"step": 1, "mean_tokens": 600.0, "budget": 400.0, "lambda_used": 0.2,
                            "lambda": pytest.approx(0.25)}


def test_closed_loop_tracks_budget():
    """From the config defaults (λ0=0.1, η=0.05) tokens start at ~690 > B=400 and settle on B."""
    ctrl = DualBudgetController.from_config(BudgetConfig(target=400.0), RewardConfig())
    observed = run_loop(ctrl, steps=300, seed=0)
    assert observed[0] > 1.5 * 400
    tail = observed[-100:]
    assert all(abs(m / 400.0 - 1.0) <= 0.10 for m in tail), (min(tail), max(tail))
    assert abs(sum(tail) / len(tail) / 400.0 - 1.0) < 0.02
    lam_star = math.log(2.0) / 1.5
    assert ctrl.lambda_tok == pytest.approx(lam_star, abs=0.05)
    # and it recovers when the budget moves: tighter budget -> higher λ, fewer tokens
    ctrl.target = 200.0
    tail2 = run_loop(ctrl, steps=400, seed=1)[-100:]
    assert abs(sum(tail2) / len(tail2) / 200.0 - 1.0) < 0.05
    assert ctrl.lambda_tok > lam_star + 0.3


def test_bounds_hold_when_budget_unreachable():
    ctrl = _ctrl(target=100.0, lr=0.5, lambda_init=1.0, lambda_min=0.2, lambda_max=3.0)
    run_loop(ctrl, 200, env=lambda lam, rng: 800.0)                  # never under budget
    assert ctrl.lambda_tok == 3.0
    assert all(0.2 <= h["lambda"] <= 3.0 for h in ctrl.history)
    run_loop(ctrl, 200, env=lambda lam, rng: 0.0)                    # always far under budget
    assert ctrl.lambda_tok == 0.2


def test_disabled_controller_keeps_lambda_but_records():
    ctrl = DualBudgetController.from_config(BudgetConfig(enabled=False), RewardConfig(lambda_tok=0.3))
    run_loop(ctrl, 10)
    assert ctrl.lambda_tok == 0.3 and len(ctrl.history) == 10


def test_state_dict_round_trip_is_exact():
    a = _ctrl(target=400.0, lr=0.05, lambda_init=0.1)
    run_loop(a, 37, seed=3)
    state = json.loads(json.dumps(a.state_dict()))                  # through a JSON checkpoint
    b = _ctrl(target=1.0, lr=1.0, lambda_init=0.0)
    b.load_state_dict(state)
    assert b.state_dict() == a.state_dict()
    assert b.lambda_tok == a.lambda_tok and b.step == 37
    # continuing both gives identical trajectories
    assert run_loop(a, 20, seed=9) == run_loop(b, 20, seed=9)
    assert a.history == b.history
    # the saved state is a copy, not a view
    state2 = a.state_dict()
    state2["history"].clear()
    assert len(a.history) == 57


def test_bad_settings_and_states_raise_user_errors():
    with pytest.raises(BudgetError, match="budget.target"):
        _ctrl(target=0.0, lr=0.1, lambda_init=0.0)
    with pytest.raises(BudgetError, match="budget.lr"):
        _ctrl(target=10.0, lr=-1.0, lambda_init=0.0)
    with pytest.raises(BudgetError, match="lambda_min"):
        _ctrl(target=10.0, lr=0.1, lambda_init=0.0, lambda_min=2.0, lambda_max=1.0)
    with pytest.raises(BudgetError, match="reward.lambda_tok"):
        _ctrl(target=10.0, lr=0.1, lambda_init=20.0)
    c = _ctrl(target=10.0, lr=0.1, lambda_init=0.0)
    for bad in (math.nan, -1.0, "many"):
        with pytest.raises(BudgetError, match="mean_tokens"):
            c.update(bad)  # type: ignore[arg-type]
    with pytest.raises(BudgetError, match="missing keys"):
        c.load_state_dict({"version": 1})
    with pytest.raises(BudgetError, match="version"):
        c.load_state_dict({**c.state_dict(), "version": 99})


def test_proportional_term_reacts_at_once_and_integral_carries_the_rest():
    """λ = clip(I + k_p·e): one step over budget by 50 % gives I = λ0 + η/2 and λ = I + k_p/2; an
    on-budget step then leaves I and drops the proportional part."""
    c = _ctrl(target=100, lr=0.2, lambda_init=1.0, kp=2.0)
    assert c.update(150) == pytest.approx(1.0 + 0.1 + 1.0)
    assert c.integral == pytest.approx(1.1)
    assert c.update(100) == pytest.approx(1.1)
    plain = _ctrl(target=100, lr=0.2, lambda_init=1.0)
    assert plain.update(150) == pytest.approx(1.1) and plain.integral == plain.lambda_tok
    with pytest.raises(BudgetError, match="budget.kp"):
        _ctrl(target=100, lr=0.2, lambda_init=1.0, kp=-1)


def test_state_round_trip_keeps_the_integral_and_reads_version_1():
    c = _ctrl(target=100, lr=0.2, lambda_init=1.0, kp=2.0)
    c.update(150)
    d = _ctrl(target=1, lr=1, lambda_init=0.0)
    d.load_state_dict(json.loads(json.dumps(c.state_dict())))
    assert (d.kp, d.integral, d.lambda_tok) == (c.kp, c.integral, c.lambda_tok)
    old = {k: v for k, v in c.state_dict().items() if k not in ("kp", "integral")} | {"version": 1}
    d.load_state_dict(old)
    assert d.kp == 0.0 and d.integral == d.lambda_tok == c.lambda_tok


def floor_env(lam: float, rng: random.Random) -> float:
    """A task whose cheapest policy is also its best (the split-information proof): at any λ >= 0
    tokens sit at a floor of 11 per episode; only a bonus (λ < 0) makes the policy spend more."""
    return 11.0 + max(0.0, -lam) * 20.0 + rng.gauss(0.0, 0.5)


def test_cap_mode_leaves_a_slack_budget_slack_target_mode_reaches_it():
    cap = _ctrl(target=13.2, lr=0.5, lambda_init=0.5, lambda_max=0.5)
    tail = run_loop(cap, steps=200, env=floor_env)[-64:]
    assert sum(tail) / len(tail) < 0.9 * 13.2                 # 16 % under B, as measured on SmolLM2
    assert cap.lambda_tok == 0.0                              # λ* = 0: the constraint is slack
    target = _ctrl(target=13.2, lr=0.5, lambda_init=0.5, lambda_max=0.5, mode="target")
    tail = run_loop(target, steps=200, env=floor_env)[-64:]
    assert abs(sum(tail) / len(tail) / 13.2 - 1.0) < 0.05
    assert target.lambda_tok < 0.0
    assert target.lambda_tok >= -0.5


def test_target_mode_bounds_and_config():
    c = _ctrl(target=10.0, lr=1.0, lambda_init=0.0, lambda_max=0.3, mode="target")
    c.update(0.0)
    assert c.lambda_tok == -0.3                               # clipped at −λ_max, not at 0
    c.update(1000.0)
    assert c.lambda_tok == 0.3
    with pytest.raises(BudgetError, match="budget.mode"):
        _ctrl(target=10.0, lr=1.0, lambda_init=0.0, mode="ceiling")
    with pytest.raises(BudgetError, match="lambda_min"):
        _ctrl(target=10.0, lr=1.0, lambda_init=0.2, lambda_min=0.1, mode="target")
    from pydantic import ValidationError
    with pytest.raises(ValidationError, match="lambda_min"):
        BudgetConfig(mode="target", lambda_min=0.1)
    ctrl = DualBudgetController.from_config(BudgetConfig(mode="target", lambda_max=2.0), RewardConfig())
    assert (ctrl.mode, ctrl.lower) == ("target", -2.0)


def test_target_mode_state_round_trip_and_old_states_load_as_cap():
    c = _ctrl(target=10.0, lr=0.5, lambda_init=0.0, lambda_max=1.0, mode="target")
    c.update(2.0)
    state = json.loads(json.dumps(c.state_dict()))
    d = _ctrl(target=99.0, lr=0.1, lambda_init=0.0)
    d.load_state_dict(state)
    assert (d.mode, d.lambda_tok, d.lower) == ("target", c.lambda_tok, -1.0) and d.lambda_tok < 0
    old = {k: v for k, v in state.items() if k != "mode"} | {"version": 2, "lambda_tok": 0.2, "integral": 0.2}
    d.load_state_dict(old)
    assert (d.mode, d.lower) == ("cap", 0.0)
