"""Communication-aware reward, n-gram repetition and the dual (Lagrangian) budget controller."""

from components.reward.budget import BudgetError, DualBudgetController
from components.reward.repetition import RepetitionError, episode_repetition, message_repetitions, ngram_repetition
from components.reward.reward import (
                                          PART_KEYS,
                                          RewardBreakdown,
                                          RewardError,
                                          apply_rewards,
                                          compute_reward,
                                          message_costs,
                                          message_rewards,
                                          message_tokens,
)

__all__ = ["PART_KEYS", "BudgetError", "DualBudgetController", "RepetitionError", "RewardBreakdown",
           "RewardError", "apply_rewards", "compute_reward", "episode_repetition", "message_costs",
           "message_repetitions", "message_rewards", "message_tokens", "ngram_repetition"]
