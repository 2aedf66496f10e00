"""GSPO, the algorithm: policy losses (registered by name), log-probs, group-relative advantages,
the step batch and the trainer's step.

The runtime that runs it (engines, precision, distributed launches, checkpoints, the training run)
is :mod:`components.runtime`, a layer above: nothing here imports it; the trainer sees an engine
through :class:`components.gspo.policy_engine.PolicyEngine`. This package init only re-exports the
pure loss / advantage API, so ``from components.gspo import gspo_loss`` loads no trainer.
"""

from components.gspo.advantages import (
    AdvantageInputError,
    AdvResult,
    group_advantages,
    make_group_ids,
)
from components.gspo.logprobs import token_logprobs
from components.gspo.loss import (
    LEVELS,
    POLICY_LOSSES,
    GspoInputError,
    LossOutput,
    LossSettings,
    get_policy_loss,
    gspo_loss,
    register_policy_loss,
)

__all__ = [
    "LEVELS",
    "POLICY_LOSSES",
    "AdvResult",
    "AdvantageInputError",
    "GspoInputError",
    "LossOutput",
    "LossSettings",
    "get_policy_loss",
    "group_advantages",
    "gspo_loss",
    "make_group_ids",
    "register_policy_loss",
    "token_logprobs",
]
