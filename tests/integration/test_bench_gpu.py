"""bench/gpu.sh and bench/gpu_train.py stay runnable off the GPU (the CPU logic-check path)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT

ROOT = REPO_ROOT


def test_gpu_sh_parses_and_says_what_must_travel() -> None:
    script = ROOT / "bench" / "gpu.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    out = subprocess.run(["bash", str(script), "--travel"], capture_output=True, text=True, check=True).stdout
    assert "DS_BUILD_OPS=0" in out and "deepspeed==0.19.8" in out
    for wheel in ("pydantic==", "pydantic-core==", "hjson==", "datasets==5.0.1", "dill==", "multiprocess==", "trl=="):
        assert wheel in out, wheel


@pytest.mark.slow
@pytest.mark.parametrize("static_cache", [False, True])
def test_gpu_train_cpu_logic_check(tmp_path: Path, static_cache: bool) -> None:
    """The trainer end to end through DeepSpeed ZeRO-2 (one rank, CPU, tiny-random): finite losses,
    changed weights, a final model; the same script runs the SmolLM2-shape model on the GPU. With
    the static cache, its greedy episodes equal the dynamic cache's (gpu.sh's static_cache part)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        env.pop(key, None)
    res = subprocess.run([sys.executable, "bench/gpu_train.py", "--device", "cpu", "--model", "tiny-random",
                          "--steps", "2", "--questions", "2", "--group", "2", "--rounds", "1", "--tokens", "8",
                          "--out", str(tmp_path), "--set", f"mas.static_cache={str(static_cache).lower()}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "all passed" in res.stdout and "gpu_train:" in res.stdout
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
    if static_cache:
        line = next(x for x in res.stdout.splitlines() if x.startswith("static_cache:"))
        n = line.split()[1].split("/")
        assert n[0] == n[1] and int(n[0]) > 0, line


def _rollout(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "bench/rollout.py", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def test_rollout_bench_runs_the_smollm2_shape_that_gpu_sh_asks_for() -> None:
    """gpu.sh passes --model smollm2-shape to bench/rollout.py on the GPU; here the same code on CPU,
    at a toy size: both sides generate the same number of tokens and the ratio line is printed."""
    res = _rollout("--model", "smollm2-shape", "--questions", "1", "--group", "2", "--agents", "2", "--rounds", "1",
                   "--tokens", "3")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "model=smollm2-shape (random init, hidden 576, 30 layers) dtype=float32" in res.stdout
    assert "warning: token counts differ" not in res.stdout
    assert "bench rollout: ours " in res.stdout and "ratio" in res.stdout
    assert "--model" in _rollout("--help").stdout  # what gpu.sh greps for


def test_rollout_bench_refuses_cuda_without_a_gpu_in_one_line() -> None:
    res = _rollout("--device", "cuda")
    assert res.returncode == 2
    expected = "bench rollout: error: --device cuda: CUDA is not available on this machine"
    assert res.stderr.strip().splitlines() == [expected]


def test_decode_ops_counts_the_same_operations_per_step_on_every_call() -> None:
    """bench/decode_ops.py: per-step counts are differences of two runs, so they must be whole,
    positive and repeatable (the decoder is deterministic in what it dispatches)."""
    sys.path.insert(0, str(ROOT))
    from bench.common import BenchSettings, build_policy
    from bench.decode_ops import VIEWS, _ours, _peer, per_step

    model, tok = build_policy(BenchSettings(model="tiny-random"))
    for side in (_ours, _peer):
        first = per_step(side, model, tok, 4, 2, 5)
        assert first == per_step(side, model, tok, 4, 2, 5)
        assert sum(first.values()) > 0 and all(float(v).is_integer() for v in first.values())
        assert "aten.mm" in first and sum(v for k, v in first.items() if k not in VIEWS) < sum(first.values())


def test_decode_ops_counts_the_cuda_path_with_no_more_kernels_than_the_4d_mask() -> None:
    """``--mask 2d`` (what the decoder passes on CUDA) drops the per-layer conversion of the ready
    mask: fewer kernel-launching operations per step than ``4d``, as the H200 timings said."""
    sys.path.insert(0, str(ROOT))
    import functools

    from bench.common import BenchSettings, build_policy
    from bench.decode_ops import VIEWS, _ours, per_step

    model, tok = build_policy(BenchSettings(model="tiny-random"))
    kernels = {}
    for mask in ("4d", "2d"):
        counts = per_step(functools.partial(_ours, mask=mask), model, tok, 4, 2, 5)
        kernels[mask] = sum(v for k, v in counts.items() if k not in VIEWS)
    assert 0 < kernels["2d"] < kernels["4d"], kernels


def test_decode_ops_refuses_an_odd_row_count() -> None:
    res = subprocess.run([sys.executable, "bench/decode_ops.py", "--rows", "3"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and "--rows must be even" in res.stderr


def test_decode_step_times_every_side_and_profiles_whole_operation_counts(capsys) -> None:
    """bench/decode_step.py on the tiny model: a time per step for each side it was asked for, the
    profile's per-step aten counts, and the bench line; the profile of one side repeats exactly."""
    sys.path.insert(0, str(ROOT))
    from bench import decode_step

    assert decode_step.main(["--model", "tiny-random", "--rows", "8", "--prompt", "16", "--short", "2", "--long",
                             "5", "--repeats", "1", "--profile", "--mask2d", "--engine", "--static"]) == 0
    out = capsys.readouterr().out
    import re

    for side in ("ours", "ours_mask2d", "ours_static", "ours_engine", "peer"):
        assert re.search(rf"^{side}: -?[0-9.]+ ms per decode step of 8 rows", out, re.M), side  # noise: may be < 0
    assert "ours_engine: 8 rows, chat prompts of" in out
    assert out.count("profile ") == 5 and "profile ours - peer, calls per step: aten::" in out
    assert out.strip().splitlines()[-1].startswith("bench decode_step: ours ")

    import torch

    from bench.common import BenchSettings, build_policy

    model, tok = build_policy(BenchSettings(model="tiny-random"))
    args = decode_step.parse_args(["--model", "tiny-random", "--rows", "4", "--prompt", "8"])
    side = decode_step.make_sides(model, tok, args, torch.device("cpu"))["ours"]
    calls = [decode_step.profile_step(side, torch.device("cpu"), 1, 4)[0] for _ in range(2)]
    assert calls[0] == calls[1] and all(float(v).is_integer() for v in calls[0].values())
    assert calls[0]["aten::mm"] > 0


def test_decode_step_refuses_bad_lengths_and_cuda_without_a_gpu() -> None:
    import torch

    cases = [(["--short", "5", "--long", "5"], "1 <= --short < --long")]
    if not torch.cuda.is_available():
        cases.append((["--device", "cuda"], "CUDA is not available"))
    for extra, message in cases:
        res = subprocess.run([sys.executable, "bench/decode_step.py", "--model", "tiny-random", *extra], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and message in res.stderr, res.stderr


def test_train_step_reports_the_decode_steps_its_rollout_took() -> None:
    """bench/train_step.py's ours line says how many decode loops and steps generation took: the
    figure that located half of the H200's slow generation (two prompt-length buckets on CPU rules
    for its 4 GSM8K prompts: twice the decode steps of the longest message)."""
    sys.path.insert(0, str(ROOT))
    from bench.common import BenchSettings, load_questions
    from bench.train_step import _side_line, run_ours

    s = BenchSettings(model="tiny-random", questions=4, group=8, tokens=8, minibatches=4, steps=1, repeats=1)
    items, _ = load_questions(s.questions * (s.steps + 1), str(ROOT / "data"))
    res = run_ours(s, items)
    assert res.detail["decode_calls"] == 1
    assert res.detail["decode_steps"] in (8, 16)  # one bucket (synthetic questions) or two (GSM8K)
    assert f"1 decode calls, {res.detail['decode_steps']} decode steps, " in _side_line(res)


def test_gpu_sh_refuses_an_unknown_part_before_doing_anything() -> None:
    """A typo in PARTS would otherwise run nothing and exit 0 with an empty summary."""
    env = {**os.environ, "PARTS": "decode_step,statc_cache"}
    res = subprocess.run(["bash", "bench/gpu.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "unknown part 'statc_cache'" in res.stderr and "Python wheels" not in res.stdout


def test_decode_step_graph_side_reports_capture_apart_and_rows_throughput(capsys) -> None:
    """--graph times mas.decode=static_graph (eager on CPU, said so), prints tokens/s per side and the
    decode_rows<rows> and decode_step_graph lines gpu.sh's rollout_rows and decode_step parts report."""
    sys.path.insert(0, str(ROOT))
    from bench import decode_step

    assert decode_step.main(["--model", "tiny-random", "--rows", "4", "--prompt", "8", "--short", "2", "--long",
                             "4", "--repeats", "1", "--graph", "--stop-check-every", "2"]) == 0
    out = capsys.readouterr().out
    assert "ours_graph: " in out and "eager (no CUDA graph on this device)" in out and " tokens/s (" in out
    assert "graph check: 4/4 rows with the dynamic decoder's greedy ids over 16 tokens" in out
    tail = out.strip().splitlines()[-3:]
    assert tail[0].startswith("bench decode_rows4: ours ") and "tokens/s" in tail[0]
    assert tail[1].startswith("bench decode_step_graph: ours ") and tail[2].startswith("bench decode_step: ours ")
    assert decode_step.main(["--model", "tiny-random", "--rows", "4", "--prompt", "8", "--short", "2", "--long",
                             "4", "--repeats", "1", "--graph-only"]) == 0  # gpu.sh's rollout_rows part
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("bench decode_rows4: ours ") and not any(x.startswith("ours: ") for x in lines)


def test_multi_agent_bench_plays_the_results_team_on_both_sides(capsys) -> None:
    """bench/multi_agent.py's CPU check: the results profile's 3 agents x 2 rounds on both sides, the
    same fixed message lengths, and the peer is a TRL-shaped rollout_func (prompt_ids, completion_ids,
    logprobs per message, one generate per round)."""
    sys.path.insert(0, str(ROOT))
    from bench import multi_agent
    from bench.common import BenchSettings, build_policy

    assert multi_agent.main(["--questions", "1", "--group", "2", "--tokens", "3", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "agents=3 rounds=2" in out and "rows/round=6" in out
    assert out.strip().splitlines()[-1].startswith("bench multi_agent: ours ")
    model, tok = build_policy(BenchSettings(model="tiny-random"))
    calls = []
    real = model.generate
    model.generate = lambda *a, **k: calls.append(1) or real(*a, **k)
    res = multi_agent.make_rollout_func(model, tok, agents=3, rounds=2, tokens=3, temperature=0.5, group=2)(
        ["What is 2 + 2?"], None)
    assert len(calls) == 2 and len(res["completion_ids"]) == 2 * 3 * 2
    assert all(len(c) == len(lp) == 3 for c, lp in zip(res["completion_ids"], res["logprobs"], strict=True))
    assert all(lp <= 0 for row in res["logprobs"] for lp in row)
    assert multi_agent.main(["--questions", "0"]) == 2


def test_train_step_names_its_peers_and_prints_phase_times() -> None:
    sys.path.insert(0, str(ROOT))
    from bench.common import BenchSettings, load_questions
    from bench.train_step import PEERS, main, run_ours

    assert PEERS == ("trl", "trl_cb")
    assert main(["--peers", "trl,vllm"]) == 2
    s = BenchSettings(model="tiny-random", questions=2, group=2, tokens=4, minibatches=2, steps=1, repeats=1)
    res = run_ours(s, load_questions(4, str(ROOT / "data"))[0])
    assert {"update_s", "pi_old_s", "optimizer_s", "peak_gib"} <= res.detail.keys()
    assert 0 < res.detail["optimizer_s"] < res.detail["update_s"] and res.detail["peak_gib"] > 0


def test_gpu_profile_fills_a_card_with_the_results_recipe() -> None:
    """params.yaml's gpu profile: the results team and group size, more questions per step (>= 128
    rows per round), decoding through the static-graph step."""
    from components.config import load_config

    res, gpu = (load_config(ROOT / "params.yaml", p) for p in ("results", "gpu"))
    assert gpu.gspo.group_size == res.gspo.group_size and gpu.mas.agents == res.mas.agents
    assert gpu.mas.rounds == res.mas.rounds and gpu.mas.max_message_tokens == res.mas.max_message_tokens
    assert gpu.gspo.questions_per_step * gpu.gspo.group_size * gpu.mas.agents >= 128
    assert gpu.mas.decode == "static_graph" and gpu.registry.model_name != res.registry.model_name


def test_gpu_sh_fits_420_s_with_the_headline_parts_first() -> None:
    text = (ROOT / "bench" / "gpu.sh").read_text()
    assert "TOTAL_S=${TOTAL_S:-420}" in text
    cuda = text[text.index('if [ "$DEVICE" = cuda ]'): text.index("else\n  part train_step")]
    order = [line.split()[1] for line in cuda.splitlines() if line.strip().startswith("part ")]
    assert order[:3] == ["train_step", "decode_step", "multi_agent"] and order[-1] == "static_cache"
    assert "--peers trl,trl_cb" in cuda and "--steps 3" in cuda.split("part decode_step")[0]
