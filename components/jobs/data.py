"""The data jobs: prepare the benchmarks (mirror > hub > package) and validate them.

The Prefect data flow runs :meth:`PrepareJob.check_one` per benchmark (nothing is written unless
every benchmark passes), then :meth:`PrepareJob.prepare_one` as one task per benchmark (cached per
input) and :meth:`PrepareJob.write_manifest` after them; :meth:`PrepareJob.run` does the same
in one process for the CLI and the DVC stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from components.jobs.base import Job, log


@dataclass
class PrepareResult:
    """What was prepared, and the validation report when it ran."""

    report: Any
    """:class:`components.data.prepare.PrepareReport`"""
    validation: Any | None = None
    """:class:`components.data.expectations.ValidationReport` (None with ``validate=False``)"""


class ValidateJob(Job):
    """``agent-gspo validate``: the great-expectations suites over prepared parquet files."""

    KIND = "validate"
    data_dir: str | None = Field(None, description="prepared data folder (default data.out_dir)")
    benchmarks: list[str] | None = Field(None, description="benchmarks to check (default data.benchmarks)")

    @property
    def report_path(self) -> Path:
        return Path(self.cfg.data.report_dir) / "validation.md"

    def run(self) -> Any:
        """:class:`components.data.expectations.ValidationReport`; raises DataValidationError on failure."""
        from components.data.expectations import validate

        return validate(Path(self.data_dir or self.cfg.data.out_dir), self.report_path,
                        list(self.benchmarks or self.cfg.data.benchmarks))


class PrepareJob(Job):
    """``agent-gspo prepare``: normalised parquet + manifest, then (by default) validation."""

    KIND = "prepare"
    benchmarks: list[str] | None = Field(None, description="benchmarks (default data.benchmarks)")
    mirror: str | None = Field(None, description="mirror folder (default $AGENT_GSPO_DATA_MIRROR, data.mirror)")
    out_dir: str | None = Field(None, description="output folder (default data.out_dir)")
    validate_after: bool = Field(True, description="run the validation suites afterwards")
    progress: bool = Field(False, description="show a progress bar")
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
        from components.data.sources import resolve_mirror

        return resolve_mirror(self.mirror, self.cfg.data.mirror)

    def check_one(self, name: str) -> Any:
        """Read and validate one benchmark, write nothing: the suites' outcome
        (:class:`components.data.prepare.CheckedBenchmark` without its records, small enough to pass
        between Prefect tasks). The flow checks every benchmark before any is written."""
        import dataclasses

        from components.data.prepare import check_benchmark

        checked = check_benchmark(name, mirror=self.mirror_dir(), use_hub=self.cfg.data.use_hub)
        return dataclasses.replace(checked, tables={})

    def refuse_failed(self, checked: list[Any]) -> None:
        """Raise (with one report of every suite, written to :attr:`report_path`) if any check failed."""
        from components.data.prepare import validation_failure

        if not all(c.ok for c in checked):
            raise validation_failure(checked, self.out, self.report_path)

    def prepare_one(self, name: str) -> Any:
        """One benchmark (:class:`components.data.prepare.BenchmarkResult`)."""
        from components.data.prepare import prepare_benchmark

        return prepare_benchmark(name, mirror=self.mirror_dir(), out_dir=self.out, use_hub=self.cfg.data.use_hub,
                                 report_path=self.report_path)

    def write_manifest(self, results: list[Any]) -> dict[str, Any]:
        from components.data.prepare import write_manifest

        return write_manifest(results, self.out)

    def validate(self) -> Any:
        return ValidateJob(cfg=self.cfg, data_dir=str(self.out), benchmarks=self.names).run()

    def run(self) -> PrepareResult:
        from components.data.prepare import prepare

        report = prepare(self.names, mirror=self.mirror_dir(), out_dir=self.out, use_hub=self.cfg.data.use_hub,
                         progress=self.progress, report_path=self.report_path)
        log.info("prepared %d benchmark(s) into %s in %.1f s", len(report.results), self.out, report.seconds)
        if self.metrics_file:
            from components.jobs.metrics import data_metrics, write_metrics

            write_metrics(self.metrics_file, data_metrics(report.manifest))
        return PrepareResult(report, self.validate() if self.validate_after else None)
