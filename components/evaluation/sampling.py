"""Seeded item sampling, re-exported: it lives in :mod:`components.data.sampling` because training
(:func:`components.data.train_items.load_train_items`) holds the sampled items out too, and
training sits beside evaluation, not above it (docs/architecture.md, "Layers")."""

from components.data.sampling import EVAL_SPLIT, SamplingError, derived_seed, sample_items

__all__ = ["EVAL_SPLIT", "SamplingError", "derived_seed", "sample_items"]
