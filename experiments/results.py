"""The per-experiment results file ``results/<name>.json``: schema, writer, reader.

One small JSON file per experiment, committed to git, is the single source of the report
(``docs/results.md`` is a pure function of the folder). The schema is a pydantic model so that
the writer and the reader share one definition: the runner builds a :class:`ResultsFile` and
dumps it; the report loads each file back through the same model, and a file that does not fit
(hand-edited, truncated, from an older schema) is a :class:`ResultsFileError` naming the file and
the offending key. Bump :data:`SCHEMA_VERSION` when a field changes meaning.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from components.errors import UserError
from components.evaluation.metrics import EvalNumbers
from components.io import write_json_atomic
from components.numbers import is_finite_number
from components.yaml_strict import FileTooLarge, read_capped_text
from experiments.stats import ItemColumns

SCHEMA_VERSION = 1


class ResultsFileError(UserError):
    """A results file that is missing, not JSON, or does not match the schema (the message names it)."""


class StrictRecord(BaseModel):
    # NaN / inf are refused: a NaN token count would otherwise become a FAIL verdict ("nan vs B"),
    # an infinite B a "-100 %" miss. strict: no true -> 1 or "3" -> 3 in a hand-edited file.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


EvalCell = EvalNumbers
"""One system on one benchmark in a results file: the evaluation's numbers, one definition."""


class BudgetInfo(StrictRecord):
    """How B was derived: ``target = fraction x baseline_mean`` (``figure`` says which number)."""

    fraction: float = Field(gt=0.0)
    target: float = Field(gt=0.0)
    measure: Literal["completion", "communicated", "total"]
    """reward.token_measure: the unit of the trainer's ``train/budget_tokens``"""
    figure: str
    """the baseline figure used, e.g. ``tokens_completion_mean`` of ``mas_untrained``"""
    system: str
    benchmarks: list[str]
    baseline_mean: float = Field(ge=0.0)
    source: str
    """results file the figure was read from (relative name, e.g. ``baselines.json``)"""

    @model_validator(mode="after")
    def _target_is_fraction_of_baseline(self) -> BudgetInfo:
        want = self.fraction * self.baseline_mean
        if abs(self.target - want) > 1e-9 * max(1.0, abs(want)):
            raise ValueError(f"target {self.target} is not fraction x baseline_mean = {self.fraction} x "
                             f"{self.baseline_mean} = {want}")
        return self


def pooled_tokens_mean(cells: dict[str, EvalCell], benchmarks: list[str], measure: str) -> float | None:
    """Tokens of ``measure`` per item pooled over ``benchmarks`` (sum of tokens / sum of items): the
    figure B is derived from; None when those cells hold no items."""
    n = sum(cells[b].n for b in benchmarks)
    return sum(getattr(cells[b], f"tokens_{measure}") for b in benchmarks) / n if n else None


class SilenceGridCounts(StrictRecord):
    """Silent / sent messages per (agent, round): ``silent[a][r] <= sent[a][r]``, both [agents][rounds]."""

    silent: list[list[int]]
    sent: list[list[int]]

    @model_validator(mode="after")
    def _same_shape(self) -> SilenceGridCounts:
        if [len(r) for r in self.silent] != [len(r) for r in self.sent]:
            raise ValueError("silent and sent must have the same [agents][rounds] shape")
        for a, (srow, trow) in enumerate(zip(self.silent, self.sent, strict=True)):
            for r, (s, t) in enumerate(zip(srow, trow, strict=True)):
                if not 0 <= s <= t:
                    raise ValueError(f"agent {a} round {r}: need 0 <= silent <= sent, got {s} of {t}")
        return self


class SilenceContent(StrictRecord):
    """Whether silence depends on what had been said (issue 52), per agent ``[silent, sent]`` by condition
    (components.evaluation.silence). An answer is a message the benchmark's grader extracts one from."""

    turn_order: str
    """mas.turn_order of the run: under ``simultaneous`` no round-0 turn follows an answer"""
    round0_no_answer: list[list[int]]
    """round-0 turns taken before any answer existed"""
    round0_after_answer: list[list[int]]
    """round-0 turns taken after an earlier agent's answer (in-turn orders only)"""
    round1_agreed: list[list[int]]
    """round-1 turns after round-0 answers that all agreed (two or more)"""
    round1_disagreed: list[list[int]]
    """round-1 turns after round-0 answers that differed"""

    @model_validator(mode="after")
    def _counts(self) -> SilenceContent:
        for key in ("round0_no_answer", "round0_after_answer", "round1_agreed", "round1_disagreed"):
            for a, pair in enumerate(getattr(self, key)):
                if len(pair) != 2 or not 0 <= pair[0] <= pair[1]:
                    raise ValueError(f"{key}[{a}]: need [silent, sent] with 0 <= silent <= sent, got {pair}")
        return self


class SilenceCounts(SilenceGridCounts):
    """Held-out silent / sent messages per (agent, round) of one multi-agent system, pooled over the
    evaluated items. A call the protocol skipped (the agent was retired by its own silence) is not a
    sent message. The optional parts are absent from files written before they were recorded."""

    by_benchmark: dict[str, SilenceGridCounts] | None = None
    """the same grid per benchmark (a collapse is judged per benchmark where this exists)"""
    content: SilenceContent | None = None
    """content dependence of silence (pooled over benchmarks)"""


class CarriedSystems(StrictRecord):
    """Systems of a baselines file that an earlier evaluation measured (``experiments run --resume``
    kept them and evaluated only the systems it lacked; :mod:`experiments.carry`). The
    top-level commit, config hash, MLflow runs and seconds are those of the latest evaluation; these
    are the earlier one's."""

    systems: list[str] = Field(min_length=1)
    git_commit: str | None
    config_hash: str
    """the earlier run's config (same as this file's but for ``eval.baselines``: checked when carried)"""
    overrides: list[str]
    eval_run_id: str | None
    eval_seconds: float = Field(ge=0.0)


class DevsetBenchmark(StrictRecord):
    """One benchmark's dev items in a dev-set evaluation (components/data/devset.py)."""

    source: str
    """``<benchmark>/<split>`` or ``<benchmark>/test-minus-sample`` (a test-only benchmark)"""
    split: str
    """the prepared split the items came from"""
    pool: int = Field(ge=1)
    n: int = Field(ge=1)
    seed: int
    """the dev ranking seed"""
    ids_sha256: str
    in_train_sources: bool
    """the source split is one of ``data.train_sources``: the recipe may have trained on these items"""


class DevsetInfo(StrictRecord):
    """Where a dev-set evaluation's items came from (``eval_split`` = ``devset``)."""

    test_limit: int | None
    """eval.limit of the test sample the dev items exclude"""
    benchmarks: dict[str, DevsetBenchmark]


class ResultsFile(StrictRecord):
    """Everything the report needs about one experiment (no transcripts: kilobytes, not megabytes)."""

    schema_version: Literal[1]
    name: str
    kind: Literal["baselines", "gspo"]
    label: str
    description: str
    extends: str | None
    overrides: list[str]
    """effective overrides on top of the profile (definition chain, then --set, then budget.target)"""
    profile: str
    config_hash: str
    data_manifest_sha256: str | None
    model: str
    """base model (model.name)"""
    trained_model: str | None
    """folder of the trained policy (gspo kind); None for baselines"""
    seed: int
    """gspo.seed"""
    eval_seed: int
    limit: int | None
    benchmarks: list[str]
    item_ids_sha256: str
    """hash of the evaluated item ids per benchmark: equal across files = same held-out sample"""
    eval_split: Literal["test", "devset"] = "test"
    """what was evaluated (experiments.eval_split): the seeded test sample, or the dev set; files
    written before it was recorded were evaluated on test"""
    devset: DevsetInfo | None = None
    """eval_split devset: each benchmark's dev source, pool, n and id hash; None for test"""
    settings: dict[str, Any]
    """the settings a comparison must share (model, agents, rounds, message cap, sample)"""
    budget: BudgetInfo | None
    last_k: int = Field(ge=1)
    """steps averaged when checking training tokens against B (experiments.last_k at run time)"""
    git_commit: str | None
    wall_seconds: float = Field(ge=0.0)
    train_seconds: float | None
    eval_seconds: float = Field(ge=0.0)
    resumed_from_step: int | None = Field(None, ge=1)
    """set when training continued from this checkpoint step (``experiments run --resume``): the
    seconds above then count the resuming process only"""
    mlflow: dict[str, str | None]
    """train_run_id, eval_run_id, model_version (ids only: tracking URIs are machine-local)"""
    eval: dict[str, dict[str, EvalCell]]
    """system -> benchmark -> numbers"""
    summary: dict[str, dict[str, Any]]
    """system -> aggregates over benchmarks (components.evaluation.summarise)"""
    history: list[dict[str, float]]
    """training metrics, one dict per step (empty for baselines)"""
    items: dict[str, dict[str, ItemColumns]] | None = None
    """system -> benchmark -> per-item outcomes in sample order (paired comparisons); None in files
    written before they were recorded (the report then falls back to unpaired errors and says so)"""
    silence: dict[str, SilenceCounts] | None = None
    """multi-agent system -> held-out silence per (agent, round); None in files written before it
    was recorded"""
    machine: dict[str, Any] | None = None
    """what it ran on (components/machine.py: CPU, bf16 flags, cores, threads, versions): greedy bf16
    decodes and wall times differ across machines; None in files written before it was recorded"""
    carried: list[CarriedSystems] | None = None
    """baselines only: systems kept from earlier evaluations of the same config and items on the same
    machine (``--resume``), one entry per earlier run; None when every system was evaluated by this run"""
    self_consistency_k: int | None = Field(None, ge=1)
    """eval.self_consistency_k of a file with a self_consistency system (its lone samples per item); None
    in files written before it was recorded"""

    @model_validator(mode="after")
    def _complete(self) -> ResultsFile:
        """A file the runner wrote has evaluation cells, and a trained one its training history: an
        emptied section would otherwise read as NOT RUN and hide a truncated or edited file."""
        if (self.eval_split == "devset") != (self.devset is not None):
            raise ValueError(f"devset: recorded for eval_split devset only (eval_split is {self.eval_split!r})")
        if self.devset is not None and sorted(self.devset.benchmarks) != sorted(self.benchmarks):
            raise ValueError(f"devset.benchmarks {sorted(self.devset.benchmarks)} are not the evaluated benchmarks "
                             f"{sorted(self.benchmarks)}")
        if not self.eval or not any(self.eval.values()):
            raise ValueError("eval: no evaluated system (a finished experiment has at least one cell)")
        if self.kind == "gspo" and not self.history:
            raise ValueError("history: empty (a trained experiment records one entry per training step)")
        if self.carried:
            if self.kind != "baselines":
                raise ValueError("carried: only a baselines file carries systems over from an earlier evaluation")
            named = [s for c in self.carried for s in c.systems]
            if len(set(named)) != len(named) or not set(named) < set(self.eval):
                raise ValueError(f"carried: systems {named} must be distinct, evaluated in this file, and leave at "
                                 f"least one system to this run (eval has {sorted(self.eval)})")
        for system, agg in self.summary.items():
            for key, value in agg.items():
                if value is None:
                    continue
                if not is_finite_number(value) or value < 0:
                    raise ValueError(f"summary.{system}.{key}: must be a finite number >= 0 or null, got {value!r}")
        return self

    @model_validator(mode="after")
    def _items_match_their_cells(self) -> ResultsFile:
        """Per-item outcomes and the evaluation cell they came from must agree (item count, correct
        answers, token sums): paired statistics read the first, tables the second, and a file where
        they differ (hand-edited, truncated) would make the two parts of the report disagree."""
        for system, per_bench in (self.items or {}).items():
            for bench, col in per_bench.items():
                cell = self.eval.get(system, {}).get(bench)
                if cell is None:
                    raise ValueError(f"items.{system}.{bench}: no eval.{system}.{bench} cell for these items")
                got = (len(col.correct), sum(col.correct), sum(col.tokens_total), sum(col.tokens_completion))
                want = (cell.n, cell.correct, cell.tokens_total, cell.tokens_completion)
                if got != want:
                    raise ValueError(f"items.{system}.{bench} (n, correct, tokens_total, tokens_completion) = {got} "
                                     f"disagrees with eval.{system}.{bench} = {want}")
        return self


def write_results(path: str | Path, results: BaseModel) -> Path:
    """Write ``results`` atomically (a crash never leaves a half-written, committed metric)."""
    path = Path(path)
    write_json_atomic(path, results.model_dump(mode="json"))
    return path


def format_validation_error(exc: ValidationError, path: Path) -> str:
    lines = [f"{path}: does not match the results schema (version {SCHEMA_VERSION})"]
    for err in exc.errors()[:8]:
        where = ".".join(str(p) for p in err["loc"]) or "<root>"
        lines.append(f"  {where}: {err['msg']}")
    return "\n".join(lines)


MAX_RESULTS_BYTES = 64 << 20
"""a results file is ~100 KB (per-item outcomes of 700 items); a `/dev/zero` link must not be read to the end"""


def read_json(path: Path) -> Any:
    """The JSON in ``path``; :class:`ResultsFileError` naming it for anything else (missing, a
    folder, a symlink loop, unreadable, not UTF-8, not JSON, nested too deep to parse)."""
    try:
        return json.loads(read_capped_text(path, MAX_RESULTS_BYTES))
    except FileTooLarge as exc:
        raise ResultsFileError(f"{path}: {exc}: not a results file") from None
    except FileNotFoundError:
        raise ResultsFileError(f"{path}: results file not found") from None
    except IsADirectoryError:
        raise ResultsFileError(f"{path}: is a folder, not a results file") from None
    except OSError as exc:
        raise ResultsFileError(f"{path}: cannot read the results file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ResultsFileError(f"{path}: not UTF-8 text (byte offset {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ResultsFileError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except RecursionError:
        raise ResultsFileError(f"{path}: JSON nested too deeply to be a results file") from None


def load_results(path: str | Path) -> ResultsFile:
    """Read and validate one results file; :class:`ResultsFileError` names the file and the key."""
    path = Path(path)
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise ResultsFileError(f"{path}: top level must be an object")
    version = raw.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ResultsFileError(f"{path}: schema_version {version!r}, this code reads version {SCHEMA_VERSION}; "
                               "rerun `agent-gspo experiments run --only "
                               f"{raw.get('name', path.stem)}` to regenerate it")
    try:
        res = ResultsFile.model_validate(raw)
    except ValidationError as exc:
        raise ResultsFileError(format_validation_error(exc, path)) from exc
    if res.name != path.stem:
        raise ResultsFileError(f"{path}: name {res.name!r} does not match the file name {path.stem!r}")
    return res


def file_kind(path: Path) -> str | None:
    try:
        raw = read_json(path)
    except ResultsFileError:
        return None  # load_results reports it
    return raw.get("kind") if isinstance(raw, dict) else None


def json_files(folder: str | Path) -> list[Path]:
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ResultsFileError(f"{folder}: results path is not a folder")
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


def load_results_dir(folder: str | Path) -> dict[str, ResultsFile]:
    """Every ``*.json`` in ``folder`` by experiment name (sorted), proof files left out (see
    :func:`experiments.proof.load_proofs`). A missing folder is an empty result: the
    report then says NOT RUN for everything instead of failing."""
    return {p.stem: load_results(p) for p in json_files(folder) if file_kind(p) != "proof"}
