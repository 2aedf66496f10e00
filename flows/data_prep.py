"""Prefect flow: check every benchmark, then stage them (one task each), swap them all in with the
manifest, validate.

All or nothing, like ``agent-gspo prepare``: a check task per benchmark reads and validates it
(~1 s each, not cached), and nothing is written unless all pass; a failure writes one
``validation.md`` covering every suite. Then, holding every benchmark's lock and the manifest's
(:meth:`~components.jobs.PrepareJob.write_locks`, in the flow's thread), one task per benchmark
writes it into a staging folder (:meth:`~components.jobs.PrepareJob.stage_one`) and one last task
swaps all the staged folders in and only then writes the manifest
(:meth:`~components.jobs.PrepareJob.commit`). A task that fails (a full disk, inputs edited since
the check) leaves every benchmark and the manifest as they were: the staging folders are removed.

Orchestration only: the work is :class:`components.jobs.PrepareJob` and
:class:`components.jobs.ValidateJob`, the jobs ``agent-gspo prepare`` / ``validate`` and the DVC
stages run.

Caching: a benchmark task's cache key is the output folder plus the sha256 of its raw input
files, so an unchanged benchmark is not re-prepared (a second run is a cache hit) and another input
or another output folder runs the task. Before submitting, the flow checks the outputs against the
manifest's recorded sha256: a deleted or edited output refreshes the cache entry
(``refresh_cache=True``), so a cache hit never stands for files that are gone. A cached result
names a staging folder that an earlier run swapped in (the commit then requires the output folder
to hold exactly its files) or, when that run failed after staging, one that was removed: that
benchmark is staged again with its cache refreshed.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

import components  # noqa: F401  (offline defaults before prefect is imported)
from components.config import Config
from components.data.sources import input_fingerprint
from components.data.spec import DataValidationError, DataWriteError
from components.errors import UserError
from components.jobs import ConfigSource, PrepareJob, ValidateJob
from flows.secret_params import SecretFree, redacting


def outputs_match_manifest(out_dir: Path, name: str) -> bool:
    """True when every output file the manifest records for ``name`` exists with its sha256."""
    import json

    try:
        entry = json.loads((out_dir / "manifest.json").read_text())["benchmarks"][name]
        recorded = entry["output_sha256"]
    except (OSError, KeyError, ValueError, TypeError):
        return False
    return bool(recorded) and all(
        (out_dir / rel).is_file() and hashlib.sha256((out_dir / rel).read_bytes()).hexdigest() == sha
        for rel, sha in recorded.items())


def _benchmark_cache_key(context: Any, parameters: dict[str, Any]) -> str:
    job, name = parameters["job"], parameters["name"]
    mirror = job.mirror_dir()
    inputs = input_fingerprint(name, mirror)
    where = hashlib.sha256(str(job.out.resolve()).encode()).hexdigest()[:16]
    return f"stage-{name}-{where}-{inputs}"  # "stage-": results of the old "prepare-" tasks are not staged


def _retry_on_io_error(task: Any, task_run: Any, state: Any) -> bool:
    """Retry I/O failures only (a refused write may be transient); a data error will fail the same way again."""
    try:
        state.result()
    except DataWriteError:
        return True
    except UserError:
        return False
    except OSError:
        return True
    except Exception:
        return False
    return False


@task(name="prepare-benchmark", retries=2, retry_delay_seconds=2, retry_condition_fn=_retry_on_io_error,
      cache_key_fn=_benchmark_cache_key, persist_result=True)
def prepare_benchmark_task(job: PrepareJob, name: str) -> Any:
    """Stage one benchmark (nothing swapped in); the flow holds the write locks meanwhile."""
    return job.stage_one(name)


@task(name="check-benchmark", cache_policy=NO_CACHE)
def check_benchmark_task(job: PrepareJob, name: str) -> Any:
    return job.check_one(name)


@task(name="write-manifest", cache_policy=NO_CACHE)
def write_manifest_task(job: PrepareJob, staged: list[Any]) -> Any:
    """Swap every staged benchmark in, then write the manifest: all or nothing."""
    return job.commit(staged)


@task(name="validate-data", cache_policy=NO_CACHE)
def validate_task(job: ValidateJob) -> str:
    try:
        report = job.run()
    except DataValidationError as exc:
        create_markdown_artifact(key="data-validation", markdown=job.report_path.read_text(),
                                 description="great-expectations validation (FAILED)")
        raise exc
    text = job.report_path.read_text()
    create_markdown_artifact(key="data-validation", markdown=text, description="great-expectations validation")
    return getattr(report, "markdown", text)


@contextlib.contextmanager
def _failed_report_posted() -> Iterator[None]:
    """A failed validation's markdown report also becomes the run's ``data-validation`` artifact."""
    try:
        yield
    except DataValidationError as exc:
        create_markdown_artifact(key="data-validation", markdown=exc.report,
                                 description="great-expectations validation (FAILED)")
        raise


def _stage(job: PrepareJob, refresh: dict[str, bool]) -> dict[str, Any]:
    """Run a stage task per benchmark (``refresh[name]``: ignore its cache entry) and wait for all of
    them before a failure propagates, so no task is still writing when the staging folders go."""
    futures = {}
    for name, again in refresh.items():
        run = prepare_benchmark_task.with_options(refresh_cache=True) if again else prepare_benchmark_task
        futures[name] = run.submit(job, name)
    for future in futures.values():
        future.wait()
    return {name: future.result() for name, future in futures.items()}


@redacting
@flow(name="data-prep", log_prints=True)
def data_prep_flow(profile: SecretFree | None = None, params: SecretFree | None = None,
                   mirror: SecretFree | None = None, benchmarks: list[SecretFree] | None = None,
                   out_dir: SecretFree | None = None, overrides: list[SecretFree] | None = None,
                   cfg: Config | None = None) -> str:
    """Prepare the configured benchmarks in parallel tasks, write the manifest, validate them.

    ``cfg`` is the pipeline's validated config; without it the flow loads ``params`` /
    ``profile`` / ``overrides`` ("section.key=value") itself. Flat parameters, not one object: each
    is a field of a deployment's form in Prefect's UI, and each carries the secret-free pattern
    that the server checks before it stores a run (docs/hardening.md).
    """
    cfg = cfg or ConfigSource(params=params, profile=profile, overrides=tuple(overrides or ())).load()
    job = PrepareJob(cfg=cfg, benchmarks=benchmarks, mirror=mirror, out_dir=out_dir)
    job.preflight()
    # all or nothing, as `agent-gspo prepare`: every benchmark is checked before any is written, and a
    # failure writes one report of all suites (tasks writing their own would overwrite each other's)
    checked = [f.result() for f in [check_benchmark_task.submit(job, n) for n in job.names]]
    with _failed_report_posted():  # the job wrote reports/validation.md; post it as well
        job.refuse_failed(checked)
        with job.write_locks():  # held here while the tasks stage; on a failure it removes their staging folders
            staged = _stage(job, {n: not outputs_match_manifest(job.out, n) for n in job.names})
            # a cache hit from a run that failed after staging names a staging folder that was removed
            staged.update(_stage(job, {n: True for n, s in staged.items() if not job.committable(s)}))
            write_manifest_task(job, [staged[n] for n in job.names])
    return validate_task(ValidateJob(cfg=cfg, data_dir=str(job.out), benchmarks=job.names))


if __name__ == "__main__":
    data_prep_flow()
