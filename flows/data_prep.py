"""Prefect flow: prepare every benchmark (one task each), write the manifest, validate.

Orchestration only: the work is :func:`components.data.prepare.prepare_benchmark`,
:func:`components.data.prepare.write_manifest` and :func:`components.data.expectations.validate`,
the same functions ``agent-gspo prepare`` / ``validate`` and the DVC stages call.

Caching: a benchmark task's cache key is the output folder plus the sha256 of its raw input
files, so an unchanged benchmark is not re-prepared (a second run is a cache hit) and another
input or another output folder runs the task. Before submitting, the flow checks the outputs
against the manifest's recorded sha256: a deleted or edited output refreshes the cache entry
(``refresh_cache=True``), so a cache hit never stands for files that are gone.
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
    name, mirror, out_dir = parameters["name"], parameters["mirror"], Path(parameters["out_dir"])
    inputs = input_fingerprint(name, Path(mirror) if mirror else None)
    where = hashlib.sha256(str(out_dir.resolve()).encode()).hexdigest()[:16]
    return f"prepare-{name}-{where}-{inputs}"


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
                   benchmarks: list[str] | None = None, out_dir: str | None = None,
                   overrides: list[str] | None = None) -> str:
    """Prepare the configured benchmarks in parallel tasks, write the manifest, validate them.

    ``overrides`` ("section.key=value") are the pipeline's: without them a run with
    ``data.benchmarks`` / ``data.out_dir`` overridden prepared every benchmark into ./data.
    """
    cfg: Config = load_config(params, profile, overrides)
    names = benchmarks or cfg.data.benchmarks
    out = out_dir or cfg.data.out_dir
    from components.data.sources import resolve_mirror

    mirror_dir = resolve_mirror(mirror, cfg.data.mirror)
    futures = []
    for n in names:
        fresh = outputs_match_manifest(Path(out), n)
        run = prepare_benchmark_task if fresh else prepare_benchmark_task.with_options(refresh_cache=True)
        futures.append(run.submit(n, str(mirror_dir) if mirror_dir else None, out, cfg.data.use_hub))
    results = [f.result() for f in futures]
    write_manifest_task(results, out)
    return validate_task(out, str(Path(cfg.data.report_dir) / "validation.md"), names)


if __name__ == "__main__":
    data_prep_flow()
