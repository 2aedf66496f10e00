"""The evaluation job: a policy (+ baselines) on the benchmarks, tracked and linked to its registry version.

With tracking on, the evaluation is one MLflow run with the setting and the evaluation config as
params and the evaluated system's summary as metrics (``eval/accuracy``, ``eval/tokens_total``,
...; per benchmark ``eval/<benchmark>/*``). When the model is a registered version the run and
the version point at each other: run tags ``eval.model_name`` / ``eval.model_version``, the
summary linked to the version's logged model, and on the version the results under the
setting's key (:mod:`components.tracking.gate`). The per-item record (``items.jsonl``) is logged
as an artifact and an evaluation table, its sha256 as the run param ``eval.items_sha256`` and the
version as ``eval.registered_version``: what the promotion gate verifies and compares. The run of a
registry version is signed (param ``eval.signature``) with the signing key
(:mod:`components.tracking.signing`; generated on first use when none is configured): the gate
refuses a record without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from components.config import Config
from components.errors import UserError
from components.evaluation import EvalRequest, evaluate
from components.evaluation.runner import EvalReport, log_to_tracker
from components.evaluation.setting import EvalSetting, setting_of
from components.io import check_not_pipeline_input, check_writable_dir
from components.jobs.base import Job, log
from components.jobs.metrics import write_eval_metrics
from components.tracking import Tracker
from components.tracking.backend import guarded
from components.tracking.gate import VERSION_PARAM, GateResult, write_result
from components.tracking.lineage import log_evaluation_inputs
from components.tracking.signing import EVAL_SIGNATURE_PARAM, EvaluationClaim, load_key, sign
from components.tracking.versions import VersionRef, registration_of, registry_client, resolve_version


@dataclass
class EvaluateResult:
    """What an evaluation produced and where it was recorded."""

    report: EvalReport
    """:class:`components.evaluation.EvalReport` (table, summary, markdown, written paths)"""
    setting: EvalSetting
    run_id: str | None = None
    version: VersionRef | None = None
    """the registry version evaluated (None for a folder, alias or hub id)"""

    @property
    def main(self) -> dict[str, Any]:
        """Summary of the evaluated system (``accuracy``, ``tokens_total``, ...)."""
        return self.report.summary[self.report.meta["main_system"]]


def evaluated_model(cfg: Config, model: str | None, *, track: bool = True) -> tuple[str | None, VersionRef | None]:
    """``model`` with a ``models:/`` alias or "newest" pinned to a version (evaluated and recorded
    as that version even if the alias moves meanwhile), and the version. A trained folder that was
    registered (it holds ``registered_model.json``) is evaluated as is and recorded on its version
    when tracking is on; other models are returned unchanged."""
    if model is None:
        return None, None
    if model.startswith("models:/"):
        ref = resolve_version(model, uri=cfg.tracking.uri)
        return ref.uri, ref
    if track and Path(model).is_dir():
        ref = registration_of(model, uri=cfg.tracking.uri)
        if ref is not None:
            log.info("%s is registered as %s: its results are recorded there", model, ref.uri)
        return model, ref
    return model, None


class EvaluateJob(Job):
    """``agent-gspo evaluate``; see the module docstring."""

    KIND = "evaluate"
    model: str | None = Field(None, description="folder, alias, hub id or models:/<name>[/<v>|@<alias>]")
    limit: int | None = Field(None, ge=1, description="items per benchmark (default eval.limit)")
    baselines: list[str] | None = Field(None, description="baselines to run beside it (default eval.baselines)")
    out_dir: str | None = Field(None, description="output folder (default eval.out_dir)")
    data_dir: str | None = Field(None, description="prepared data (default data.out_dir)")
    split: str = Field("test", description="benchmark split")
    track: bool = Field(True, description="log an MLflow run (and record results on a registry version)")
    metrics_file: str | None = Field(None, description="folder: one small JSON per system, <system>.json "
                                     "(DVC metrics: a row each in `dvc metrics show`)")

    def run(self) -> EvaluateResult:
        check_not_pipeline_input(self.out_dir or self.cfg.eval.out_dir, "output folder (--out / eval.out_dir)")
        if self.metrics_file:  # refused before the evaluation, not after it (a pipeline input too)
            check_not_pipeline_input(self.metrics_file, "metrics folder (--metrics)")
            if Path(self.metrics_file).exists() and not Path(self.metrics_file).is_dir():
                raise UserError(f"metrics folder (--metrics) {self.metrics_file}: is a file, not a folder "
                                "(evaluate writes one file per system into it)")
            check_writable_dir(self.metrics_file, "metrics folder (--metrics)")
            out = Path(self.out_dir or self.cfg.eval.out_dir).resolve()
            if out in Path(self.metrics_file).resolve().parents:
                raise UserError(f"--metrics {self.metrics_file}: inside the evaluation folder {out}, whose files are "
                                "published as one set (a metrics file there could replace one of them); write it "
                                "elsewhere")
        result = self._evaluate()
        if self.metrics_file:
            write_eval_metrics(self.metrics_file, result.report.summary)
        return result

    def _evaluate(self) -> EvaluateResult:
        cfg = self.cfg
        model, version = evaluated_model(cfg, self.model, track=self.track)
        log.info("evaluate %s on %s (%s items each)", model or cfg.model.name, ", ".join(cfg.eval.benchmarks),
                 self.limit or cfg.eval.limit or "all")
        request = EvalRequest(model=model, limit=self.limit, baselines=self.baselines,
                              out_dir=Path(self.out_dir) if self.out_dir else None,
                              data_dir=Path(self.data_dir) if self.data_dir else None, split=self.split)
        if not self.track:
            report = evaluate(cfg, request)
            return EvaluateResult(report, self._setting(report))
        tags = {"stage": "evaluate", "eval.model": model or cfg.model.name}
        key = None
        if version is not None:
            tags |= {"eval.model_name": version.name, "eval.model_version": version.version}
            key = load_key(cfg.registry.signing, cfg.tracking.uri, create=True)  # before the evaluation: fail fast
        with Tracker.from_config(cfg, "evaluate", tags) as tracker:
            report = evaluate(cfg, request)
            setting = self._setting(report)
            registered = {VERSION_PARAM: version.uri} if version is not None else {}  # immutable: the gate checks it
            tracker.log_params(setting.params() | {f"eval.{k}": v for k, v in cfg.eval.model_dump().items()}
                               | {"model": model or cfg.model.name} | registered)
            model_id = self._model_id(version)
            log_to_tracker(tracker, report, report.meta["main_system"], model_id=model_id)
            log_evaluation_inputs(tracker, report.meta, model_id)  # data read and model evaluated, as run inputs
            run_id = tracker.run_id
            if version is not None:
                if key is not None and run_id and report.meta.get("items_sha256"):  # the record the gate reads
                    claim = EvaluationClaim(run_id, version.uri, setting.key(), str(report.meta["items_sha256"]),
                                            str(report.meta["main_system"]))  # as log_to_tracker logged them
                    tracker.log_params({EVAL_SIGNATURE_PARAM: sign(key, claim.payload())})
                self._record(version, setting, report, run_id)
        return EvaluateResult(report, setting, run_id, version)

    def _setting(self, report: EvalReport) -> EvalSetting:
        meta = report.meta
        return setting_of(self.cfg, meta["item_ids"], split=meta["split"], limit=meta["limit"],
                          data_manifest_sha256=meta["data_manifest_sha256"])

    def _model_id(self, version: VersionRef | None) -> str | None:
        if version is None:
            return None
        uri = self.cfg.tracking.uri
        mv = guarded(uri, f"read {version.name} v{version.version}",
                     lambda: registry_client(uri).get_model_version(version.name, version.version))
        source = str(mv.source or "")  # MLflow 3 registers a logged model as "models:/<model_id>"
        return getattr(mv, "model_id", None) or (source.removeprefix("models:/") if source.startswith("models:/m-")
                                                 else None)

    def _record(self, version: VersionRef, setting: EvalSetting, report: EvalReport, run_id: str | None) -> None:
        """The results on the version under the setting's key (what the promotion gate compares)."""
        main = report.summary[report.meta["main_system"]]
        result = GateResult(float(main["accuracy"]), float(main["tokens_total"]), int(main["n"]), run_id)
        client = registry_client(self.cfg.tracking.uri)
        guarded(self.cfg.tracking.uri, f"record evaluation on {version.uri}", lambda: write_result(
            client, version.name, version.version, setting.key(), setting.model_dump(mode="json"), result))
        log.info("recorded on %s under setting %s (%s): accuracy %.4f, tokens %d; per-item record %s (sha256 %s, "
                 "run param eval.items_sha256)", version.uri, setting.key(), setting.describe(), result.accuracy,
                 int(result.tokens_total), report.paths.get("items"), report.meta.get("items_sha256"))

