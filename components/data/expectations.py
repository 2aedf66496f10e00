"""Great Expectations (1.x API only) suites for the normalised benchmark records.

One suite per benchmark, parameterised per split (row count and split value are
``$PARAMETER``s), run through a ``ValidationDefinition`` on a pandas whole-dataframe batch:

- every record column exists; id, benchmark, split, question, answer, answer_type, meta non-null
- row count equals the expected count for the split; ids unique; split/benchmark/answer_type fixed
- no duplicated record (same question, choices and answer as an earlier row) beyond the upstream
  data's own (``BenchmarkSpec.known_duplicates``: MMLU and MultiArith repeat a few problems)
- answer format per answer_type: numeric ``^-?\\d+(?:\\.\\d+)?$``, choice a letter (A-D MMLU, A-E AQuA),
  math and code non-blank; question non-blank
- choice benchmarks have exactly 4 (MMLU) / 5 (AQuA) choices; other benchmarks have none
- sizes: question, each choice and answer at most ``data.max_question_chars`` / ``max_choice_chars`` /
  ``max_answer_chars`` characters (``$PARAMETER``s; :class:`components.data.integrity.TextLimits`)
- code (HumanEval): the prompt defines ``def <entry_point>(`` and the test's ``check(candidate)``
  holds an ``assert`` (else every completion "passes" or none can be called)

Measured: ``import great_expectations`` ~3 s, ``get_context(mode="ephemeral")`` ~10 ms, one run
~0.1 s. The context, data source and validation definitions are still cached at module level
(behind a lock, since Prefect may run tasks in threads) so repeated validations skip set-up.
"""

from __future__ import annotations

import ast
import json
import os
import re

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")  # before the import: GX may phone home

import threading  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import great_expectations as gx  # noqa: E402
import pandas as pd  # noqa: E402
from great_expectations.data_context.types.base import ProgressBarsConfig  # noqa: E402

from components.data.integrity import (  # noqa: E402
    DataIntegrityError,
    TamperedDataError,
    TextLimits,
    read_checked,
)
from components.data.spec import RECORD_COLUMNS, DataValidationError, get_spec  # noqa: E402
from components.io import check_not_pipeline_input, check_writable_dir, write_text_atomic  # noqa: E402

DUPLICATE = "repeats_earlier_record"
"""Derived 0/1 column: the row's question, choices and answer equal an earlier row's."""
LONGEST_CHOICE = "longest_choice_chars"
"""Derived column: characters of the row's longest option (0 without choices)."""
SIZED = {"question": ("max_question_chars", "question"), "answer": ("max_answer_chars", "answer"),
         LONGEST_CHOICE: ("max_choice_chars", "choice")}
"""column -> (config key, :class:`TextLimits` field) of the size expectations"""
ENTRY_POINT_DEFINED = "entry_point_defined_in_prompt"
TEST_ASSERTS = "test_check_has_assert"
"""Derived bool columns of code benchmarks: see :func:`_code_checks`."""
NUMERIC_RE = r"^-?\d+(?:\.\d+)?$"  # brief: ^-?\d+(\.\d+)?$, non-capturing (pandas warns on groups)
NONBLANK_RE = r"\S"
MAX_EXAMPLES = 5

_LOCK = threading.RLock()
_STATE: dict[str, Any] = {}


@dataclass
class SuiteResult:
    """Outcome of one benchmark suite on one split."""

    benchmark: str
    split: str
    success: bool
    rows: int
    expected_rows: int
    failures: list[dict[str, Any]] = field(default_factory=list)
    """Each: expectation, column, observed, example_rows (ids of up to 5 offending rows)."""
    file: str | None = None
    """The prepared file validated (None: records in memory, before prepare writes them)."""


@dataclass
class ValidationReport:
    """Outcome of :func:`validate` over prepared parquet files."""

    success: bool
    results: list[SuiteResult]
    markdown: str
    """The report text (also written to ``path``; the Prefect flow posts it as an artifact)."""
    path: Path


def _context() -> tuple[Any, Any]:
    """The cached ephemeral context and the whole-dataframe batch definition."""
    if "ctx" not in _STATE:
        ctx = gx.get_context(mode="ephemeral")
        ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        asset = ctx.data_sources.add_pandas("agent_gspo_records").add_dataframe_asset("records")
        _STATE["ctx"] = ctx
        _STATE["batch"] = asset.add_batch_definition_whole_dataframe("whole")
    return _STATE["ctx"], _STATE["batch"]


def build_suite(name: str) -> gx.ExpectationSuite:
    """The expectation suite of benchmark ``name`` (parameters: ``rows``, ``splits``)."""
    spec = get_spec(name)
    E = gx.expectations
    exps: list[Any] = [E.ExpectColumnToExist(column=c) for c in RECORD_COLUMNS]
    exps.append(E.ExpectTableRowCountToEqual(value={"$PARAMETER": "rows"}))
    exps += [E.ExpectColumnValuesToNotBeNull(column=c) for c in RECORD_COLUMNS if c != "choices"]
    exps += [
        E.ExpectColumnValuesToBeUnique(column="id"),
        E.ExpectColumnValuesToBeInSet(column="split", value_set={"$PARAMETER": "splits"}),
        E.ExpectColumnValuesToBeInSet(column="benchmark", value_set=[name]),
        E.ExpectColumnValuesToBeInSet(column="answer_type", value_set=[spec.answer_type]),
        E.ExpectColumnValuesToMatchRegex(column="question", regex=NONBLANK_RE),
    ]
    answer_re = {"numeric": NUMERIC_RE, "choice": f"^[{spec.letters}]$"}.get(spec.answer_type, NONBLANK_RE)
    exps.append(E.ExpectColumnValuesToMatchRegex(column="answer", regex=answer_re))
    exps += [E.ExpectColumnValueLengthsToBeBetween(column=c, min_value=0, max_value={"$PARAMETER": key})
             for c, key in (("question", "max_question_chars"), ("answer", "max_answer_chars"))]
    exps.append(E.ExpectColumnValuesToBeBetween(column=LONGEST_CHOICE, min_value=0,
                                                max_value={"$PARAMETER": "max_choice_chars"}))
    n = spec.n_choices or 0
    exps.append(E.ExpectColumnValuesToBeBetween(column="n_choices", min_value=n, max_value=n))
    exps.append(E.ExpectColumnSumToBeBetween(column=DUPLICATE, min_value=0,
                                             max_value={"$PARAMETER": "max_duplicates"}))
    if spec.answer_type == "code":
        exps += [E.ExpectColumnValuesToBeInSet(column=c, value_set=[True]) for c in (ENTRY_POINT_DEFINED, TEST_ASSERTS)]
    suite = gx.ExpectationSuite(name=f"agent_gspo.{name}")
    for e in exps:
        suite.add_expectation(e)
    return suite


def _validation(name: str) -> Any:
    ctx, batch = _context()
    key = f"vd.{name}"
    if key not in _STATE:
        suite = ctx.suites.add(build_suite(name))
        _STATE[key] = ctx.validation_definitions.add(
            gx.ValidationDefinition(name=f"agent_gspo.{name}", data=batch, suite=suite)
        )
    return _STATE[key]


def _n_choices(value: Any) -> int:
    return 0 if value is None or (isinstance(value, float) and pd.isna(value)) else len(value)


def _repeats(frame: pd.DataFrame) -> pd.Series:
    """1 where question + choices + answer equal an earlier row's, else 0."""
    if not {"question", "answer"} <= set(frame):
        return pd.Series(0, index=frame.index)
    choices = frame["choices"].map(lambda c: "\x1e".join(map(str, c)) if _n_choices(c) else "") \
        if "choices" in frame else ""
    key = frame["question"].astype(str) + "\x1f" + choices + "\x1f" + frame["answer"].astype(str)
    return key.duplicated(keep="first").astype(int)


def _code_checks(meta: Any) -> tuple[bool, bool]:
    """(prompt defines ``def <entry_point>(``, test's ``check`` function holds an ``assert``).

    ``meta`` is the record's meta (JSON text as in parquet, or a dict). The test is parsed, not
    grepped, so an ``assert`` in a comment or string does not count.
    """
    try:
        m = json.loads(meta) if isinstance(meta, str) else dict(meta)
        prompt, test, entry = str(m["prompt"]), str(m["test"]), str(m["entry_point"])
    except (TypeError, ValueError, KeyError):
        return False, False
    defined = re.search(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(entry)}[ \t]*\(", prompt, re.M) is not None
    try:
        tree = ast.parse(test)
    except (SyntaxError, ValueError):
        return defined, False
    asserts = any(isinstance(node, ast.FunctionDef) and node.name == "check"
                  and any(isinstance(n, ast.Assert) for n in ast.walk(node)) for node in ast.walk(tree))
    return defined, asserts


def _longest(value: Any) -> int:
    return max((len(str(c)) for c in value), default=0) if _n_choices(value) else 0


def validate_frame(name: str, split: str, df: pd.DataFrame, limits: TextLimits | None = None,
                   file: str | None = None) -> SuiteResult:
    """Run benchmark ``name``'s suite on the records of one split (parquet-shaped frame).

    ``df`` has the record columns (``meta`` as JSON text). Derived columns (``n_choices``, the
    repeat flag, the code checks) are added for their expectations; the caller's frame is not modified.
    ``limits``: the ``data.max_*_chars`` sizes (None: the schema's defaults); ``file``: where the rows
    were read, named in the report.
    """
    limits = TextLimits.of(limits)
    spec = get_spec(name)
    expected = spec.expected.get(split)
    if expected is None:
        return SuiteResult(
            name,
            split,
            False,
            len(df),
            0,
            [
                {
                    "expectation": "split_in_allowed_set",
                    "column": "split",
                    "observed": split,
                    "example_rows": [],
                    "expected": sorted(spec.expected),
                }
            ],
        )
    frame = df.reset_index(drop=True).copy()
    frame["n_choices"] = frame["choices"].map(_n_choices) if "choices" in frame else 0
    frame[LONGEST_CHOICE] = frame["choices"].map(_longest) if "choices" in frame else 0
    frame[DUPLICATE] = _repeats(frame)
    if spec.answer_type == "code":
        meta = frame["meta"] if "meta" in frame else pd.Series(None, index=frame.index, dtype=object)
        checks = meta.map(_code_checks)
        frame[ENTRY_POINT_DEFINED] = checks.map(lambda c: c[0]).astype(bool)
        frame[TEST_ASSERTS] = checks.map(lambda c: c[1]).astype(bool)
    with _LOCK:
        result = _validation(name).run(
            batch_parameters={"dataframe": frame},
            expectation_parameters={"rows": expected, "splits": [split],
                                    "max_duplicates": spec.known_duplicates.get(split, 0),
                                    "max_question_chars": limits.question, "max_answer_chars": limits.answer,
                                    "max_choice_chars": limits.choice},
            result_format="COMPLETE",
        )
    ids = frame["id"].tolist() if "id" in frame else []
    failures = []
    for er in result.results:
        if er.success:
            continue
        cfg = er.expectation_config
        res = er.result or {}
        idx = (res.get("unexpected_index_list") or [])[:MAX_EXAMPLES]
        examples = [ids[i] if isinstance(i, int) and i < len(ids) else i for i in idx]
        if cfg.kwargs.get("column") == DUPLICATE:  # a sum has no unexpected rows: name the repeats
            examples = [ids[i] for i in frame.index[frame[DUPLICATE] == 1][:MAX_EXAMPLES] if i < len(ids)]
        observed = res.get("observed_value")
        if observed is None and "unexpected_count" in res:
            observed = (
                f"{res['unexpected_count']} unexpected value(s), e.g. "
                f"{[_short(v) for v in (res.get('partial_unexpected_list') or [])[:3]]}"
            )
        if er.exception_info and er.exception_info.get("raised_exception"):
            observed = f"error: {er.exception_info.get('exception_message')}"
        kwargs = {k: v for k, v in cfg.kwargs.items() if k not in ("batch_id", "column")}
        column = cfg.kwargs.get("column")
        sized = SIZED.get(column) if "length" in cfg.type or column == LONGEST_CHOICE else None
        if sized is not None:  # name the limit and the sizes, not a 60-character cut of a huge value
            key, limit = sized[0], getattr(limits, sized[1])
            counted = frame[column] if column == LONGEST_CHOICE else frame[column].astype(str).str.len()
            observed = (f"{int((counted > limit).sum())} value(s) above data.{key}={limit} characters "
                        f"(longest {int(counted.max())})")
            kwargs = {"at_most_chars": limit, "key": f"data.{key}"}
        if cfg.kwargs.get("column") == DUPLICATE:
            observed = f"{int(observed or 0)} record(s) repeating an earlier record's question, choices and answer"
            kwargs = {"at_most": spec.known_duplicates.get(split, 0)}
        failures.append(
            {
                "expectation": cfg.type,
                "column": cfg.kwargs.get("column"),
                "observed": observed,
                "example_rows": examples,
                "expected": kwargs,
            }
        )
    return SuiteResult(name, split, not failures, len(frame), expected, failures, file)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def render_report(results: list[SuiteResult]) -> str:
    """Readable markdown: a summary table, then each failure with example row ids."""
    ok = all(r.success for r in results)
    lines = [
        "# Data validation report",
        "",
        f"**{'PASSED' if ok else 'FAILED'}**: {sum(r.success for r in results)}/{len(results)} "
        "suites passed (great-expectations).",
        "",
        "| benchmark | split | rows | expected | result |",
        "|---|---|---:|---:|---|",
    ]
    lines += [
        f"| {r.benchmark} | {r.split} | {r.rows} | {r.expected_rows} | "
        f"{'ok' if r.success else f'FAILED ({len(r.failures)})'} |"
        for r in results
    ]
    for r in (r for r in results if not r.success):
        lines += ["", f"## {r.benchmark} / {r.split}" + (f" ({r.file})" if r.file else ""), ""]
        for f in r.failures:
            col = f" on `{f['column']}`" if f.get("column") else ""
            lines.append(
                f"- `{f['expectation']}`{col}: observed {f['observed']}; expected {f.get('expected')}"
            )
            if f["example_rows"]:
                lines.append(f"  - example rows: {', '.join(map(str, f['example_rows']))}")
    return "\n".join(lines) + "\n"


def _failed(name: str, split: str, check: str, observed: str, fix: str, file: Path) -> SuiteResult:
    """A suite that could not run on its file (missing, or not what the manifest records)."""
    failure = {"expectation": check, "column": None, "observed": observed, "example_rows": [], "expected": fix}
    return SuiteResult(name, split, False, 0, get_spec(name).expected[split], [failure], str(file))


def validate(
    data_dir: str | os.PathLike[str], report_path: str | os.PathLike[str], benchmarks: list[str],
    limits: TextLimits | None = None,
) -> ValidationReport:
    """Re-validate prepared ``data_dir/<benchmark>/<split>.parquet`` and write a markdown report.

    Each file is first checked against the sha256 the manifest records for it: a changed file
    fails as ``file_matches_manifest`` in the report (its suite not run), and the error raised is
    then the one-line :class:`DataIntegrityError` of the first such file;
    ``limits`` are the ``data.max_*_chars`` sizes (None: the schema's defaults). The report is written
    (atomically) whether or not the suites pass; on any failure :class:`DataValidationError` is
    raised carrying the report text. A file that is not UTF-8 or not parquet is a one-line DataError.
    """
    data_dir, report_path = Path(data_dir), Path(report_path)
    check_not_pipeline_input(report_path, "validation report (data.report_dir)")
    check_writable_dir(report_path.parent, "report folder (data.report_dir)")
    results: list[SuiteResult] = []
    tampered: list[str] = []
    for name in benchmarks:
        spec = get_spec(name)
        for split in spec.expected:
            path = data_dir / name / f"{split}.parquet"
            if not path.is_file():
                results.append(_failed(name, split, "file_exists", f"{path} missing",
                                       "run `agent-gspo prepare` first", path))
                continue
            try:
                table = read_checked(data_dir, name, split)
            except DataIntegrityError as exc:
                tampered.append(str(exc))
                results.append(_failed(name, split, "file_matches_manifest", str(exc),
                                       f"re-run `agent-gspo prepare --benchmarks {name}`", path))
                continue
            results.append(validate_frame(name, split, table.to_pandas(), TextLimits.of(limits), str(path)))
    markdown = render_report(results)
    write_text_atomic(report_path, markdown)
    report = ValidationReport(all(r.success for r in results), results, markdown, report_path)
    if tampered:  # one line, as every other reader refuses it
        more = f" ({len(tampered) - 1} more file(s) changed)" if len(tampered) > 1 else ""
        raise TamperedDataError(f"{tampered[0]}{more}; report: {report_path}", markdown)
    if not report.success:
        failed = [f"{r.benchmark}/{r.split}" for r in results if not r.success]
        raise DataValidationError(
            f"data validation failed for {', '.join(failed)}; report: {report_path}\n{markdown}", markdown
        )
    return report
