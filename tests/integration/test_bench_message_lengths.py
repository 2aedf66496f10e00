"""bench/message_lengths.py: the share a cap would cut and the tokens it would keep."""

from __future__ import annotations

import pytest
from helpers.paths import REPO_ROOT

from bench.message_lengths import cap_table


def test_cap_table_counts_the_messages_a_cap_cuts_and_the_tokens_it_keeps() -> None:
    lengths = [10, 64, 100, 256]
    rows = {k: (share, cost) for k, share, cost in cap_table(lengths, (64, 128, 256))}
    assert rows[64] == (0.75, 1.0)                     # 64, 100 and 256 reach a cap of 64
    assert rows[128][0] == 0.25 and rows[128][1] == pytest.approx((10 + 64 + 100 + 128) / (10 + 64 * 3))
    assert rows[256] == (0.25, pytest.approx((10 + 64 + 100 + 256) / 202))
    assert cap_table([], (64,)) == [(64, 0.0, 0.0)]


@pytest.mark.slow
def test_the_bench_runs_on_the_tiny_model(prepared_data) -> None:
    import os
    import subprocess
    import sys

    root = REPO_ROOT
    res = subprocess.run([sys.executable, "bench/message_lengths.py", "--model", "tiny-random", "--items", "1",
                          "--benchmarks", "gsm8k", "--cap", "16", "--data", str(prepared_data)], cwd=root,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    lines = [line for line in res.stdout.splitlines() if line.startswith("message_lengths: cap ")]
    assert len(lines) == 5 and lines[0].endswith("of 6 messages; completion tokens 1.00x of cap 64"), res.stdout
