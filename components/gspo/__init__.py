"""GSPO: policy losses (registered by name) and group-relative advantages.

The trainer, engines and checkpoints live in sibling modules; this package init only re-exports
the pure loss / advantage API so ``from components.gspo import gspo_loss`` works without importing
any engine.
"""

from components.gspo.advantages import (
    AdvantageInputError,
    AdvResult,
    group_advantages,
    make_group_ids,
)
from components.gspo.loss import (
    LEVELS,
    POLICY_LOSSES,
    GspoInputError,
    LossOutput,
    get_policy_loss,
    gspo_loss,
    register_policy_loss,
    token_logprobs,
)

__all__ = [
    "LEVELS",
    "POLICY_LOSSES",
    "AdvResult",
    "AdvantageInputError",
    "GspoInputError",
    "LossOutput",
    "get_policy_loss",
    "group_advantages",
    "gspo_loss",
    "make_group_ids",
    "register_policy_loss",
    "token_logprobs",
]
