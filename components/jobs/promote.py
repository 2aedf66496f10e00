"""The promotion job: gate a registered version against ``@champion`` under the configured setting.

The gate pairs the candidate's per-item record with the champion's under the ``registry.gate``
rule (:mod:`components.tracking.promotion`). The gate's setting is the one ``agent-gspo evaluate``
runs under with the same config (:func:`components.evaluation.setting.planned_setting`), so
``evaluate`` then ``promote`` with the same ``--profile`` / ``--set`` compare like with like.
``evaluate_champion`` measures a champion that has no per-item record under that setting first
(the nightly pipeline does, so a change of data or protocol does not stall promotion); otherwise
that is an error naming the command. That measurement is tracked like any evaluation (an MLflow
run with the report as artifacts, the results on the champion's version) but its files go to a
temporary folder, never to ``eval.out_dir``: that folder holds the evaluation published for the
candidate, which must stay.

The gate accepts only records signed under the signing key of ``registry.signing``
(:func:`components.tracking.signing.trust_for`: ``$AGENT_GSPO_SIGNING_KEY``, the key file, or the
key the first evaluation generated beside a sqlite registry); promote never generates one.

When the gate's setting was measured under a ``mas`` protocol other than the one the candidate
records for serving (:mod:`components.tracking.recorded`), a warning says so: the decision is then
not about the system ``@champion`` would serve.
"""

from __future__ import annotations

import tempfile
from typing import TYPE_CHECKING, Any

from pydantic import Field

from components.errors import UserError
from components.evaluation.setting import planned_setting
from components.jobs.base import Job, log
from components.tracking.promotion import ChampionNotEvaluated, GateRule, GateSpec, promote
from components.tracking.recorded import protocol_differences, recorded_mas
from components.tracking.signing import trust_for
from components.tracking.versions import registry_client, resolve_version

if TYPE_CHECKING:
    from components.tracking.promotion import PromotionDecision


class PromoteJob(Job):
    """``agent-gspo promote``; see the module docstring."""

    KIND = "promote"
    candidate: str | None = Field(None, description="models:/<name>[/<v>|@<alias>] (default: newest version)")
    limit: int | None = Field(None, ge=1, description="items per benchmark of the gate's setting (default eval.limit)")
    evaluate_champion: bool = Field(False, description="evaluate a champion lacking results under the setting")

    def run(self) -> PromotionDecision:
        cfg = self.cfg
        text = self.candidate or f"models:/{cfg.registry.model_name}"
        if not text.startswith("models:/"):
            raise UserError(f"--candidate {text!r}: give a registry URI models:/<name>[/<version>|@<alias>]")
        client = registry_client(cfg.tracking.uri)
        ref = resolve_version(text, uri=cfg.tracking.uri, client=client)
        setting = planned_setting(cfg, limit=self.limit)
        reg = cfg.registry
        rule = GateRule(reg.gate.rule(), reg.min_accuracy, reg.gate.test)
        spec = GateSpec(setting.key(), rule, setting.describe(), trust_for(reg.signing, cfg.tracking.uri))
        log.info("promote %s under setting %s (%s); rule: %s", ref.uri, setting.key(), setting.describe(),
                 rule.describe())
        _warn_if_not_served_protocol(ref.name, ref.version, setting.protocol, cfg.tracking.uri)

        def gate():
            return promote(client, ref.name, ref.version, gate=spec)

        try:
            return gate()
        except ChampionNotEvaluated as exc:
            if not self.evaluate_champion:
                raise
            from components.jobs.evaluate import EvaluateJob

            log.info("champion v%s has no per-item record under setting %s: evaluating it first", exc.champion,
                     setting.key())
            with tempfile.TemporaryDirectory(prefix=f"agent-gspo-champion-v{exc.champion}-") as out:
                measured = EvaluateJob(cfg=cfg, model=f"models:/{ref.name}/{exc.champion}", limit=self.limit,
                                       baselines=[], out_dir=out).run()
            log.info("champion v%s measured in MLflow run %s (its report is among the run's artifacts; %s "
                     "keeps the candidate's evaluation)", exc.champion, measured.run_id, cfg.eval.out_dir)
            return gate()


def _warn_if_not_served_protocol(name: str, version: str, evaluated: dict[str, Any], uri: str) -> None:
    """One warning line when the gate's numbers come from another ``mas`` protocol than the
    candidate serves with (its recorded settings); the gate still decides."""
    recorded = recorded_mas(name, version, uri=uri)
    if recorded is None:
        return
    diffs = protocol_differences(evaluated, recorded)
    if diffs:
        log.warning("warning: the gate compares numbers measured under mas %s, but models:/%s/%s records "
                    "another protocol for serving (evaluated->served: %s): the decision is not about the system "
                    "it serves; evaluate and promote with --set mas.<key>=<served value> to compare that",
                    _brief(evaluated), name, version, ", ".join(diffs))


def _brief(protocol: dict[str, Any]) -> str:
    return (f"{protocol.get('agents')} agents x {protocol.get('rounds')} rounds {protocol.get('topology')} "
            f"{protocol.get('protocol')}")
