"""evaluate() end to end with injected fake engines on a synthetic prepared data folder (no torch)."""

import json

import pytest
from helpers.prepared import write_prepared

from components.config import Config, MasConfig
from components.evaluation.runner import EvalInputError, EvalRequest, System, eval_metrics, evaluate
from components.machine import describe, machine_fingerprint
from components.mas.records import Episode, Message
from components.tracking.metric_names import validate_metrics


def _write(data, bench, rows):
    write_prepared(data, bench, "test", rows)


@pytest.fixture
def data(tmp_path):
    return make_eval_data(tmp_path)


def make_eval_data(tmp_path):
    """Synthetic prepared data: 9 gsm8k and 5 aqua test items (also test_evaluation_publish's)."""
    d = tmp_path / "data"
    _write(d, "gsm8k", [{"id": f"gsm8k/test/{i}", "benchmark": "gsm8k", "split": "test", "question": f"{i}+1?",
                         "choices": None, "answer": str(i + 1), "answer_type": "numeric", "meta": "{}"}
                        for i in range(9)])
    _write(d, "aqua", [{"id": f"aqua/test/{i}", "benchmark": "aqua", "split": "test", "question": "pick",
                        "choices": ["A)1", "B)2", "C)3", "D)4", "E)5"], "answer": "B", "answer_type": "choice",
                        "meta": "{}"} for i in range(5)])
    return d


class FakeEngine:
    """Answers right on even item numbers; 2 messages, the second silent; records each call."""

    def __init__(self, right=True):
        self.right, self.calls = right, []
        self.cfg = MasConfig(agents=2, rounds=1)

    def rollout(self, items, group_size, *, seed, greedy=False):
        self.calls.append((len(items), seed, greedy))
        out = []
        for it in items:
            even = int(it.id.rsplit("/", 1)[1]) % 2 == 0
            ans = it.answer if (even and self.right) else "zzz 999"
            msgs = [Message(it.id, 0, 0, "solver", 0, [1] * 5, [2] * 3, [0.0] * 3, False, [1], f"The answer is {ans}"),
                    Message(it.id, 0, 1, "critic", 0, [1] * 5, [3], [0.0], True, [], "<silent>")]
            out.append(Episode(it.id, 0, it.benchmark, msgs))
        return out


def _cfg(**ev):
    return Config.model_validate({"eval": {"benchmarks": ["gsm8k", "aqua"], "batch_size": 2, "seed": 7, **ev},
                                  "mas": {"agents": 2, "rounds": 1}})


class FakeClient:
    def __init__(self):
        self.tables = {}

    def log_table(self, run_id, data, artifact_file):
        self.tables[artifact_file] = data


class FakeTracker:
    uri, run_id = "fake://", "run-1"

    def __init__(self, name="main"):
        self.name, self.metrics, self.tags, self.artifacts, self.children = name, {}, {}, [], []
        self.params, self.client = {}, FakeClient()

    def log_params(self, params):
        self.params.update(params)

    def set_tags(self, tags):
        self.tags.update(tags)

    def log_metrics(self, metrics, step=None, model_id=None):
        self.metrics.update(validate_metrics(metrics))

    def log_artifact(self, path, artifact_path=None):
        self.artifacts.append(path)

    def child(self, run_name, tags=None):
        import contextlib

        sub = FakeTracker(run_name)
        sub.tags.update(tags or {})
        self.children.append(sub)
        return contextlib.nullcontext(sub)


def test_evaluate_with_injected_systems(data, tmp_path):
    main, cot = FakeEngine(), FakeEngine(right=False)
    systems = [System("agent_gspo", main), System("self_consistency", cot, greedy=False)]
    tracker = FakeTracker()
    rep = evaluate(_cfg(), EvalRequest(limit=5, data_dir=data, out_dir=tmp_path / "eval"), systems=systems,
                   tracker=tracker)
    assert [(r.system, r.benchmark) for r in rep.table] == [
        ("agent_gspo", "gsm8k"), ("agent_gspo", "aqua"), ("self_consistency", "gsm8k"), ("self_consistency", "aqua")]
    ids = rep.meta["item_ids"]["gsm8k"]
    assert len(ids) == 5
    evens = sum(int(i.rsplit("/", 1)[1]) % 2 == 0 for i in ids)
    g = rep.table[0]
    assert g.n == 5 and g.correct == evens and g.accuracy == pytest.approx(evens / 5)
    assert g.silence_rate == 0.5 and g.turns == 1.0 and g.tokens_total == 5 * (10 + 4)
    assert rep.table[2].correct == 0 and rep.table[2].tokens_per_correct is None
    # batching: the greedy system pools both benchmarks (10 items, 5 calls of batch_size 2); the
    # sampled one batches per benchmark (ceil(5/2) = 3 calls each) with its own seed per call
    assert [c[0] for c in main.calls] == [2, 2, 2, 2, 2] and all(c[2] for c in main.calls)
    assert [c[0] for c in cot.calls] == [2, 2, 1, 2, 2, 1]
    assert not any(c[2] for c in cot.calls) and len({c[1] for c in cot.calls}) == 6
    for name in ("gsm8k.json", "aqua.json", "summary.json", "report.md", "accuracy_vs_tokens.png",
                 "silence_by_agent_round.png"):
        assert (tmp_path / "eval" / name).is_file(), name
    dvc = json.loads((tmp_path / "eval" / "gsm8k.json").read_text())
    assert dvc["agent_gspo"]["accuracy"] == g.accuracy
    assert rep.summary["agent_gspo"]["tokens_total"] == 10 * 14
    assert rep.meta["data_manifest_sha256"] and len(rep.meta["config_hash"]) == 64
    # what it ran on, in the summary, the report and the MLflow tags (greedy bf16 decodes differ across CPUs)
    assert rep.meta["machine"] == machine_fingerprint()
    assert json.loads((tmp_path / "eval" / "summary.json").read_text())["meta"]["machine"] == rep.meta["machine"]
    assert f"- **machine**: {describe(rep.meta['machine'])}" in (tmp_path / "eval" / "report.md").read_text()
    assert tracker.tags["eval.machine"] == describe(rep.meta["machine"])
    assert rep.silence.total == [[10], [10]] and rep.silence.silent == [[0], [10]]
    # a grid per multi-agent system only: self-consistency's samples are not agents in rounds
    assert list(rep.silence_grids) == ["agent_gspo"] and rep.silence_grids["agent_gspo"] == rep.silence
    # and per benchmark, and by condition (issue 52): simultaneous, so no round-0 turn follows an answer
    per_bench, content = rep.silence_more["agent_gspo"]
    assert {b: (g.silent, g.total) for b, g in per_bench.items()} == {b: ([[0], [5]], [[5], [5]])
                                                                      for b in ("gsm8k", "aqua")}
    assert content.round0_no_answer == [[0, 10], [10, 10]] and content.round0_after_answer == [[0, 0], [0, 0]]
    # tracker: contract names only, main on the run, the baseline in a nested run
    assert tracker.metrics["eval/gsm8k/accuracy"] == g.accuracy
    assert "eval/gsm8k/tokens_per_correct" in tracker.metrics
    (child,) = tracker.children
    assert child.tags["eval.system"] == "self_consistency" and "eval/aqua/tokens_per_correct" not in child.metrics
    assert len(tracker.artifacts) == 7  # six report files and items.jsonl


def test_same_inputs_same_sample_and_numbers(data, tmp_path):
    runs = [evaluate(_cfg(), EvalRequest(limit=3, data_dir=data, out_dir=tmp_path / f"e{k}"),
                     systems=[System("agent_gspo", FakeEngine())]) for k in range(2)]
    assert runs[0].table == runs[1].table and runs[0].meta["item_ids"] == runs[1].meta["item_ids"]


def test_bad_inputs_are_user_errors(data, tmp_path):
    with pytest.raises(EvalInputError, match="unknown baseline"):
        evaluate(_cfg(), EvalRequest(baselines=["oracle"], data_dir=data, out_dir=tmp_path))
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="gsm9k"):  # the schema refuses it before any evaluation
        _cfg(benchmarks=["gsm9k"])
    with pytest.raises(EvalInputError, match="unique names"):
        evaluate(_cfg(), EvalRequest(data_dir=data, out_dir=tmp_path), systems=[System("a", FakeEngine()), System("a",
                 FakeEngine())])
    from components.errors import UserError

    with pytest.raises(UserError, match="not found"):
        evaluate(_cfg(benchmarks=["svamp"]), EvalRequest(data_dir=data, out_dir=tmp_path), systems=[System("a",
                 FakeEngine())])


def test_eval_metrics_names():
    from components.evaluation.metrics import aggregate

    rows = [aggregate("gsm8k", "s", [])]
    assert set(eval_metrics(rows, "s")) == {"eval/gsm8k/accuracy", "eval/gsm8k/tokens_total",
                                            "eval/gsm8k/silence_rate"}


@pytest.mark.slow
def test_real_mlflow_tracker_gets_contract_metrics_nested_runs_and_artifacts(data, tmp_path):
    from mlflow import MlflowClient

    from components.tracking import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    systems = [System("agent_gspo", FakeEngine()), System("single_cot", FakeEngine(right=False))]
    with Tracker(uri, "eval-test", "evaluate") as tracker:
        rep = evaluate(_cfg(), EvalRequest(limit=3, data_dir=data, out_dir=tmp_path / "eval"), systems=systems,
                       tracker=tracker)
        run_id = tracker.run_id
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.data.metrics["eval/gsm8k/accuracy"] == rep.table[0].accuracy
    assert run.data.metrics["eval/accuracy"] == rep.summary["agent_gspo"]["accuracy"]  # the summary, as metrics
    assert run.data.metrics["eval/tokens_total"] == rep.summary["agent_gspo"]["tokens_total"]
    assert run.data.tags["eval.system"] == "agent_gspo"
    assert {a.path for a in client.list_artifacts(run_id, "eval")} >= {"eval/report.md", "eval/summary.json",
                                                                        "eval/accuracy_vs_tokens.png"}
    children = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'")
    assert [c.data.tags["eval.system"] for c in children] == ["single_cot"]
    assert children[0].data.metrics["eval/aqua/accuracy"] == 0.0


def test_progress_is_logged_per_batch_with_counts(data, tmp_path, caplog, monkeypatch):
    """Long evaluations say where they are (terminal via the CLI, Prefect via flows.logs), through the
    one throttled progress reporter (here a line per batch), and no tqdm bar besides."""
    monkeypatch.setenv("AGENT_GSPO_PROGRESS_S", "0")
    caplog.set_level("INFO", logger="components")
    monkeypatch.setattr("tqdm.auto.tqdm", None)  # a bar would interleave with the lines
    evaluate(_cfg(), EvalRequest(limit=3, data_dir=data, out_dir=tmp_path / "eval"), systems=[System("agent_gspo",
             FakeEngine())])
    lines = [r.getMessage() for r in caplog.records if r.name == "components.evaluation.runner"]
    assert "evaluate agent_gspo (pooled): 6 items in 3 batch(es) of up to 2" in lines
    assert any(line.startswith("evaluate agent_gspo (pooled): 6 items done in") for line in lines), lines
    progress = [r.getMessage() for r in caplog.records if r.name == "components.progress"]
    assert progress[-1].startswith("evaluate agent_gspo (pooled) 3/3 batches (6/6 items)"), progress
    assert "evaluate: grading 6 episodes" in lines


def test_every_evaluation_keeps_its_items(data, tmp_path):
    """One record per system and item (answer, gold, grade, tokens, silence, transcript), published with
    the aggregates, hashed into the summary, the report and a run param, and logged as a table."""
    from components.data.prepare import load_split
    from components.evaluation.items import ITEMS_PARAM, items_sha256, read_items, regrade

    tracker = FakeTracker()
    systems = [System("agent_gspo", FakeEngine()), System("single_cot", FakeEngine(right=False))]
    rep = evaluate(_cfg(), EvalRequest(limit=4, data_dir=data, out_dir=tmp_path / "eval"), systems=systems,
                   tracker=tracker)
    path = tmp_path / "eval" / "items.jsonl"
    rows = read_items(path)
    assert len(rows) == 2 * 8 and [r["system"] for r in rows] == ["agent_gspo"] * 8 + ["single_cot"] * 8
    assert [r["id"] for r in rows[:8]] == rep.meta["item_ids"]["gsm8k"] + rep.meta["item_ids"]["aqua"]
    first = rows[0]
    n = int(first["id"].rsplit("/", 1)[1])
    assert first["gold"] == str(n + 1) and first["correct"] == (n % 2 == 0)
    assert first["prediction"] == (f"The answer is {n + 1}" if n % 2 == 0 else "The answer is zzz 999")
    assert first["extracted"] == (str(n + 1) if n % 2 == 0 else "999")
    assert first["tokens"] == {"prompt": 10, "completion": 4, "communicated": 3, "total": 14}
    assert first["silence"] == [[0, 0, False], [1, 0, True]]
    assert first["transcript"][0] == {"agent": 0, "round": 0, "text": first["prediction"], "silent": False}
    for system in ("agent_gspo", "single_cot"):
        mine = [r for r in rows if r["system"] == system]
        assert sum(r["correct"] for r in mine) == rep.summary[system]["correct"]
        assert sum(r["tokens"]["total"] for r in mine) == rep.summary[system]["tokens_total"]
    sha = items_sha256(path.read_bytes())
    assert rep.meta["items_sha256"] == sha == tracker.params[ITEMS_PARAM]
    assert "[items.jsonl](items.jsonl)" in rep.markdown and sha in (tmp_path / "eval" / "report.md").read_text()
    table = tracker.client.tables["eval_items.json"]
    assert len(table["transcript"]) == 16 and json.loads(table["transcript"][0]) == first["transcript"]
    # the same inputs give the same bytes
    again = evaluate(_cfg(), EvalRequest(limit=4, data_dir=data, out_dir=tmp_path / "again"),
                     systems=systems[:1] + systems[1:])
    assert again.meta["items_sha256"] == sha
    # re-grading with the one grader agrees with what was recorded; a flipped grade is found
    items = {(b, i.id): i for b in ("gsm8k", "aqua") for i in load_split(data, b, "test")}
    assert regrade(rows, items, where="items.jsonl")["disagree"] == 0
    rows[0]["correct"] = not rows[0]["correct"]
    found = regrade(rows, items, where="items.jsonl")
    assert found["disagree"] == 1 and found["disagreements"][0]["line"] == 1


def test_items_file_keeps_text_with_unicode_line_separators():
    """A model's text may hold U+2028, U+2029, U+0085 or U+001C..U+001E (the tiny policy's gibberish
    did): json.dumps leaves the first three unescaped, so the reader splits lines on "\\n" only."""
    from components.evaluation.items import decode, encode

    rows = [{f: None for f in ("prediction", "extracted", "gold", "grading_error", "silence")}
            | {"system": "s", "benchmark": "b", "id": str(i), "correct": False, "tokens": {"total": 1},
               "transcript": text}
            for i, text in enumerate(["a\u2028b", "c\u2029d\x85e", "f\x1cg\x1dh\x1ei\x0bj\x0ck\rl"])]
    assert decode(encode(rows), "items.jsonl") == rows
