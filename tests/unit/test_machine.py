"""The machine fingerprint recorded next to evaluations and results (components/machine.py)."""

from __future__ import annotations

import json

import torch

from components.machine import BF16_FLAGS, _cpuinfo, describe, machine_fingerprint

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile amx_int8

processor\t: 1
model name\t: Some Other Name
flags\t\t: fpu
"""


def test_cpuinfo_reads_the_first_block_and_keeps_only_the_kernel_relevant_flags(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    name, flags = _cpuinfo(path)
    assert name == "Intel(R) Xeon(R) Processor"
    assert flags == ["avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx2", "fma"]
    assert "amx_int8" not in flags and set(flags) <= set(BF16_FLAGS)


def test_cpuinfo_without_the_file_or_with_garbage_is_unknown_not_an_error(tmp_path):
    assert _cpuinfo(tmp_path / "absent") == (None, [])
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\xff\xfe no colon here\n\n\x00")
    assert _cpuinfo(garbage) == (None, [])


def test_cpuinfo_of_an_arm_machine_reads_features(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\nmodel name\t: ARMv8\n")
    assert _cpuinfo(path) == ("ARMv8", [])


def test_the_fingerprint_is_json_and_names_this_process_threads_and_torch():
    fp = machine_fingerprint()
    assert json.loads(json.dumps(fp)) == fp
    assert fp["torch"] == torch.__version__
    assert fp["torch_threads"] == torch.get_num_threads()
    assert fp["cores"] >= 1
    assert fp["gpu"] is None or isinstance(fp["gpu"], str)


def test_describe_says_not_recorded_for_old_files_and_names_the_isa_on_cpu():
    assert describe(None) == "not recorded"
    assert describe({}) == "not recorded"
    line = describe({"cpu": "Xeon", "cores": 2, "cpu_flags": ["avx2", "avx512_bf16", "amx_bf16"],
                     "torch": "2.13.0+cpu", "torch_threads": 2, "gpu": None})
    assert line == "Xeon, 2 cores (avx512_bf16, amx_bf16), torch 2.13.0+cpu x 2 threads"
    assert describe({"gpu": "NVIDIA H200", "cpu_flags": ["amx_bf16"], "torch": "2.11", "torch_threads": 16}) \
        == "NVIDIA H200, torch 2.11 x 16 threads"


def test_the_thread_count_is_read_at_each_call_not_cached():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert machine_fingerprint()["torch_threads"] == 1
        torch.set_num_threads(2)
        assert machine_fingerprint()["torch_threads"] == 2
    finally:
        torch.set_num_threads(before)
