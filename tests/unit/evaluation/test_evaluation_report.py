"""Report rendering (paper-shaped tables), DVC metrics JSON and plots on synthetic rows."""

import json

import pytest

from components.evaluation.metrics import EvalRow, SilenceGrid, summarise
from components.evaluation.plots import plot_accuracy_vs_tokens, plot_silence_heatmap
from components.evaluation.report import benchmark_metrics, fmt_tokens, render_markdown, write_reports

SYSTEMS = ("agent_gspo", "single_cot")
BENCHES = ("gsm8k", "mmlu", "humaneval")


def _row(bench, system, n, correct, tokens):
    acc = correct / n
    return EvalRow(benchmark=bench, system=system, n=n, correct=correct, accuracy=acc,
                   accuracy_se=(acc * (1 - acc) / n) ** 0.5, tokens_prompt=tokens // 2,
                   tokens_completion=tokens // 2, tokens_communicated=10, tokens_total=tokens,
                   tokens_prompt_mean=tokens / 2 / n, tokens_completion_mean=tokens / 2 / n,
                   tokens_communicated_mean=10 / n, tokens_total_mean=tokens / n,
                   tokens_per_correct=tokens / correct if correct else None, turns=2.0, messages=3.0,
                   silence_rate=0.25, grading_errors=0)


@pytest.fixture
def rows():
    return [_row(b, s, 4, (i + j) % 3, 1000 * (i + 1) + 12345 * j)
            for j, s in enumerate(SYSTEMS) for i, b in enumerate(BENCHES)]


def test_fmt_tokens():
    assert [fmt_tokens(x) for x in (512, 12345, 7_200_000, None, 2.5)] == ["512", "12.3k", "7.2M", "-", "2.5"]


def test_markdown_has_paper_shape(rows):
    md = render_markdown(rows, summarise(rows), {"model": "tiny-random", "seed": 1, "config_hash": "abc"})
    lines = md.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| System | gsm8k"))
    assert lines[header] == "| System | gsm8k | mmlu | humaneval |"
    body = lines[header + 2:header + 2 + len(SYSTEMS)]
    assert [b.split(" | ")[0] for b in body] == ["| agent_gspo", "| single_cot"]
    # gsm8k agent_gspo: 0/4 correct, 1000 tokens; mmlu single_cot: 2/4 -> 0.500 ± 0.250 / 14.3k
    assert "0.000 ± 0.000 / 1000" in body[0]
    assert "0.500 ± 0.250 / 14.3k" in body[1]
    assert "## Tokens per correct answer" in md and "`tiny-random`" in md
    tpc = lines[lines.index("## Tokens per correct answer") + 6]
    assert tpc.startswith("| agent_gspo | - | 2000 |")


def test_silence_by_role_only_for_split_information_rows(rows):
    """Who fell silent is shown where the task has roles (splitinfo), and nowhere else."""
    assert "## Silence by role" not in render_markdown(rows, summarise(rows), {})
    trained = _row("splitinfo", "agent_gspo", 4, 4, 1600).model_copy(
        update={"silence_uninformed": 0.826, "silence_informed": 0.0})
    holder_only = _row("splitinfo", "single_cot", 4, 3, 800).model_copy(update={"silence_informed": 0.25})
    lines = render_markdown(rows + [trained, holder_only], summarise(rows), {}).splitlines()
    at = lines.index("## Silence by role")
    assert lines[at + 4:at + 8] == ["| System | splitinfo |", "|---|---|", "| agent_gspo | 0.83 / 0.00 |",
                                    "| single_cot | - / 0.25 |"]


def test_benchmark_metrics_and_written_files(rows, tmp_path):
    m = benchmark_metrics(rows, "mmlu")
    assert set(m) == set(SYSTEMS) and m["single_cot"]["accuracy"] == 0.5 and m["agent_gspo"]["n"] == 4
    summary = summarise(rows)
    paths = write_reports(tmp_path / "eval", rows, summary, {"seed": 1}, "# r\n")
    assert {p.name for p in paths.values()} == {"gsm8k.json", "mmlu.json", "humaneval.json", "summary.json",
                                                 "report.md"}
    on_disk = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert on_disk["systems"]["agent_gspo"]["accuracy"] == pytest.approx(summary["agent_gspo"]["accuracy"])
    assert len(on_disk["rows"]) == 6
    assert not [p for p in (tmp_path / "eval").iterdir() if p.name.endswith(".tmp")]


def test_plots_are_pngs(rows, tmp_path):
    a = plot_accuracy_vs_tokens(rows, tmp_path / "acc.png")
    grid = SilenceGrid("agent_gspo", silent=[[1, 0], [2, 1]], total=[[4, 4], [4, 0]])
    b = plot_silence_heatmap(grid, tmp_path / "sil.png")
    c = plot_silence_heatmap(None, tmp_path / "none.png")
    for p in (a, b, c):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 1000
