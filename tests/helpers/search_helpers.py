"""Shared by the search tests: a config whose ``search`` bookkeeping keys are changed."""

from __future__ import annotations

from components.config import Config


def searching(cfg: Config, **search: object) -> Config:
    """``cfg`` with ``search.<key>`` set (trials, budget_tokens, ...): what run_search reads them from."""
    return cfg.model_copy(update={"search": cfg.search.model_copy(update=search)})
