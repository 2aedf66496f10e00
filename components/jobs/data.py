"""The data jobs: prepare the benchmarks (mirror > hub > package) and validate them.

The Prefect data flow runs :meth:`PrepareJob.check_one` per benchmark (nothing is written unless
every benchmark passes), then, holding :meth:`PrepareJob.write_locks`, :meth:`PrepareJob.stage_one`
as one task per benchmark (cached per input) and :meth:`PrepareJob.commit` after them, which swaps
every staged benchmark in and then writes the manifest (all or nothing); :meth:`PrepareJob.run`
does the same in one process for the CLI and the DVC stage.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from components.data.expectations import ValidationReport, validate
from components.data.outputs import (
    CheckedBenchmark,
    StagedBenchmark,
    check_prepare,
    commit,
    committable,
    stage_benchmark,
    write_locks,
)
from components.data.prepare import PrepareReport, check_benchmark, prepare, validation_failure
from components.data.sources import resolve_mirror
from components.dvc_outputs import check_report_target
from components.errors import UserError
from components.jobs.base import Job, log
from components.jobs.metrics import data_metrics, write_metrics


@dataclass
class PrepareResult:
    """What was prepared, and the validation report when it ran."""

    report: PrepareReport
    """:class:`components.data.prepare.PrepareReport`"""
    validation: ValidationReport | None = None
    """:class:`components.data.expectations.ValidationReport` (None with ``validate=False``)"""


class ValidateJob(Job):
    """``agent-gspo validate``: the great-expectations suites over prepared parquet files."""

    KIND = "validate"
    data_dir: str | None = Field(None, description="prepared data folder (default data.out_dir)")
    benchmarks: list[str] | None = Field(None, description="benchmarks to check (default data.benchmarks)")

    @property
    def report_path(self) -> Path:
        return Path(self.cfg.data.report_dir) / "validation.md"

    def run(self) -> ValidationReport:
        """:class:`components.data.expectations.ValidationReport`; raises DataValidationError on failure."""
        check_report_target(self.report_path, self.data_dir or self.cfg.data.out_dir, self.cfg.data.out_dir)
        data = Path(self.data_dir or self.cfg.data.out_dir)
        if not data.is_dir():  # one line, not a report of every split "missing" (and no report written)
            what = "is not a folder" if data.exists() else "no such folder"
            raise UserError(f"prepared data folder (--data / data.out_dir) {data}: {what}; "
                            "run `agent-gspo prepare` first (or give the folder it wrote)")
        return validate(Path(self.data_dir or self.cfg.data.out_dir), self.report_path,
                        list(self.benchmarks or self.cfg.data.benchmarks), self.cfg.data)


class PrepareJob(Job):
    """``agent-gspo prepare``: normalised parquet + manifest, then (by default) validation."""

    KIND = "prepare"
    benchmarks: list[str] | None = Field(None, description="benchmarks (default data.benchmarks)")
    mirror: str | None = Field(None, description="mirror folder (default $AGENT_GSPO_DATA_MIRROR, data.mirror)")
    out_dir: str | None = Field(None, description="output folder (default data.out_dir)")
    validate_after: bool = Field(True, description="run the validation suites afterwards")
    progress: bool = Field(True, description="log progress lines (components.progress)")
    metrics_file: str | None = Field(None, description="write rows per benchmark and split here (DVC metrics)")

    @property
    def names(self) -> list[str]:
        return list(self.benchmarks or self.cfg.data.benchmarks)

    @property
    def out(self) -> Path:
        return Path(self.out_dir or self.cfg.data.out_dir)

    @property
    def report_path(self) -> Path:
        """Where a failed suite's report goes (the same file ``validate`` writes)."""
        return Path(self.cfg.data.report_dir) / "validation.md"

    def mirror_dir(self) -> Path | None:
        return resolve_mirror(self.mirror, self.cfg.data.mirror)

    def check_one(self, name: str) -> CheckedBenchmark:
        """Read and validate one benchmark, write nothing: the suites' outcome
        (:class:`components.data.outputs.CheckedBenchmark` without its records, small enough to pass
        between Prefect tasks). The flow checks every benchmark before any is written."""
        import dataclasses


        checked = check_benchmark(name, mirror=self.mirror_dir(), use_hub=self.cfg.data.use_hub, limits=self.cfg.data)
        return dataclasses.replace(checked, tables={})

    def refuse_failed(self, checked: list[CheckedBenchmark]) -> None:
        """Raise (with one report of every suite, written to :attr:`report_path`) if any check failed."""
        if not all(c.ok for c in checked):
            raise validation_failure(checked, self.out, self.report_path)

    def preflight(self) -> None:
        """What can be refused before any benchmark is read (names, folders, mirror, existing manifest)."""
        check_report_target(self.report_path, self.out, self.cfg.data.out_dir)
        check_prepare(self.names, self.out, self.report_path, self.mirror_dir())

    def write_locks(self) -> contextlib.AbstractContextManager[None]:
        """The locks the write phase holds (every benchmark's, then the manifest's): the flow holds them
        in its own thread from before :meth:`stage_one` until after :meth:`commit`."""
        return write_locks(self.out, self.names)

    def stage_one(self, name: str) -> StagedBenchmark:
        """Read, validate and write one benchmark into its staging folder, swapping nothing in
        (:class:`components.data.outputs.StagedBenchmark`). Only under :meth:`write_locks`."""
        checked = check_benchmark(name, mirror=self.mirror_dir(), use_hub=self.cfg.data.use_hub, limits=self.cfg.data)
        if not checked.ok:  # the inputs changed since the flow's check: still nothing is written
            raise validation_failure([checked], self.out, self.report_path)
        return stage_benchmark(checked, self.out)

    def committable(self, staged: StagedBenchmark) -> bool:
        """Whether :meth:`commit` can use a (possibly cached) :meth:`stage_one` result."""
        return committable(staged, self.out)

    def commit(self, staged: list[StagedBenchmark]) -> dict[str, Any]:
        """Swap every staged benchmark in, then write the manifest (only under :meth:`write_locks`)."""
        return commit(staged, self.out)

    def validate(self) -> ValidationReport:
        return ValidateJob(cfg=self.cfg, data_dir=str(self.out), benchmarks=self.names).run()

    def run(self) -> PrepareResult:
        check_report_target(self.report_path, self.out, self.cfg.data.out_dir)
        report = prepare(self.names, mirror=self.mirror_dir(), out_dir=self.out, data=self.cfg.data,
                         progress=self.progress, report_path=self.report_path)
        log.info("prepared %d benchmark(s) into %s in %.1f s", len(report.results), self.out, report.seconds)
        if self.metrics_file:
            write_metrics(self.metrics_file, data_metrics(report.manifest))
        return PrepareResult(report, self.validate() if self.validate_after else None)
