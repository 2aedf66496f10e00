"""Agent-GSPO library: data, scoring, models, multi-agent rollouts, reward, GSPO, evaluation.

Importing the package applies the offline-safety environment defaults first.
"""

from components.env import apply_offline_defaults

apply_offline_defaults()

__version__ = "0.1.0"
