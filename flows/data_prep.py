"""Prefect flow: prepare every benchmark (one task each), write the manifest, validate.

Orchestration only: the work is :func:`components.data.prepare.prepare_benchmark`,
:func:`components.data.prepare.write_manifest` and :func:`components.data.expectations.validate`,
the same functions ``agent-gspo prepare`` / ``validate`` and the DVC stages call.

Caching: a benchmark task's cache key is the sha256 of its raw input files plus the sha256 of
its current outputs, so an unchanged benchmark whose outputs are still in place is not
re-prepared, while a changed input or a deleted/edited output runs the task again.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

import components  # noqa: F401  (offline defaults before prefect is imported)
from components.config import Config, load_config
from components.data.prepare import prepare_benchmark, write_manifest
from components.data.sources import input_fingerprint


def _output_fingerprint(out_dir: Path, name: str) -> str:
    digest = hashlib.sha256()
    folder = out_dir / name
    for path in sorted(folder.glob("*.parquet")) if folder.exists() else []:
        digest.update(path.name.encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _benchmark_cache_key(context: Any, parameters: dict[str, Any]) -> str:
    name, mirror, out_dir = parameters["name"], parameters["mirror"], Path(parameters["out_dir"])
    inputs = input_fingerprint(name, Path(mirror) if mirror else None)
    return f"prepare-{name}-{inputs}-{_output_fingerprint(out_dir, name)}"


def _retry_on_io_error(task: Any, task_run: Any, state: Any) -> bool:
    """Retry transient I/O failures only; a data error will fail the same way again."""
    from components.errors import UserError

    try:
        state.result()
    except UserError:
        return False
    except OSError:
        return True
    except Exception:
        return False
    return False


@task(name="prepare-benchmark", retries=2, retry_delay_seconds=2, retry_condition_fn=_retry_on_io_error,
      cache_key_fn=_benchmark_cache_key, persist_result=True)
def prepare_benchmark_task(name: str, mirror: str | None, out_dir: str, use_hub: bool) -> Any:
    return prepare_benchmark(name, mirror=Path(mirror) if mirror else None, out_dir=Path(out_dir), use_hub=use_hub)


@task(name="write-manifest", cache_policy=NO_CACHE)
def write_manifest_task(results: list[Any], out_dir: str) -> Any:
    return write_manifest(results, Path(out_dir))


@task(name="validate-data", cache_policy=NO_CACHE)
def validate_task(data_dir: str, report_path: str, benchmarks: list[str]) -> str:
    from components.data.expectations import DataValidationError, validate

    try:
        report = validate(Path(data_dir), Path(report_path), benchmarks)
    except DataValidationError as exc:
        create_markdown_artifact(key="data-validation", markdown=Path(report_path).read_text(),
                                 description="great-expectations validation (FAILED)")
        raise exc
    text = Path(report_path).read_text()
    create_markdown_artifact(key="data-validation", markdown=text, description="great-expectations validation")
    return getattr(report, "markdown", text)


@flow(name="data-prep", log_prints=True)
def data_prep_flow(profile: str | None = None, params: str | None = None, mirror: str | None = None,
                   benchmarks: list[str] | None = None, out_dir: str | None = None) -> str:
    """Prepare the configured benchmarks in parallel tasks, write the manifest, validate them."""
    cfg: Config = load_config(params, profile)
    names = benchmarks or cfg.data.benchmarks
    out = out_dir or cfg.data.out_dir
    from components.data.sources import resolve_mirror

    mirror_dir = resolve_mirror(mirror, cfg.data.mirror)
    futures = [prepare_benchmark_task.submit(n, str(mirror_dir) if mirror_dir else None, out, cfg.data.use_hub)
               for n in names]
    results = [f.result() for f in futures]
    write_manifest_task(results, out)
    return validate_task(out, str(Path(cfg.data.report_dir) / "validation.md"), names)


if __name__ == "__main__":
    data_prep_flow()
