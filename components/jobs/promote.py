"""The promotion job: gate a registered version against ``@champion`` under the configured setting.

The gate's setting is the one ``agent-gspo evaluate`` runs under with the same config
(:func:`components.evaluation.setting.planned_setting`), so ``evaluate`` then ``promote`` with
the same ``--profile`` / ``--set`` compare like with like. ``evaluate_champion`` measures a
champion that has no results under that setting first (the nightly pipeline does, so a change of
data or protocol does not stall promotion); otherwise that is an error naming the command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from components.errors import UserError
from components.jobs.base import Job, log

if TYPE_CHECKING:
    from components.tracking.promotion import PromotionDecision


class PromoteJob(Job):
    """``agent-gspo promote``; see the module docstring."""

    KIND = "promote"
    candidate: str | None = Field(None, description="models:/<name>[/<v>|@<alias>] (default: newest version)")
    limit: int | None = Field(None, ge=1, description="items per benchmark of the gate's setting (default eval.limit)")
    evaluate_champion: bool = Field(False, description="evaluate a champion lacking results under the setting")

    def run(self) -> PromotionDecision:
        from components.evaluation.setting import planned_setting
        from components.tracking.promotion import ChampionNotEvaluated, GateRule, promote
        from components.tracking.versions import registry_client, resolve_version

        cfg = self.cfg
        text = self.candidate or f"models:/{cfg.registry.model_name}"
        if not text.startswith("models:/"):
            raise UserError(f"--candidate {text!r}: give a registry URI models:/<name>[/<version>|@<alias>]")
        client = registry_client(cfg.tracking.uri)
        ref = resolve_version(text, uri=cfg.tracking.uri, client=client)
        setting = planned_setting(cfg, limit=self.limit)
        reg = cfg.registry
        rule = GateRule(reg.accuracy_tolerance, reg.max_token_ratio, reg.min_accuracy)
        log.info("promote %s under setting %s (%s)", ref.uri, setting.key(), setting.describe())

        def gate():
            return promote(client, ref.name, ref.version, setting_key=setting.key(), setting_text=setting.describe(),
                           rule=rule)

        try:
            return gate()
        except ChampionNotEvaluated as exc:
            if not self.evaluate_champion:
                raise
            from components.jobs.evaluate import EvaluateJob

            log.info("champion v%s has no results under setting %s: evaluating it first", exc.champion,
                     setting.key())
            EvaluateJob(cfg=cfg, model=f"models:/{ref.name}/{exc.champion}", limit=self.limit, baselines=[]).run()
            return gate()
