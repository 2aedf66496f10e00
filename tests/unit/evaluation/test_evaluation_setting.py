"""What makes two evaluations comparable (the promotion gate's key): the items, the data, the protocol, the
weights' precision and the code timeout; not the sampling knobs a greedy evaluation never uses."""

from __future__ import annotations

from helpers.paths import REPO_ROOT

from components.config import load_config
from components.evaluation.setting import _decoding_dtype, setting_of

ROOT = REPO_ROOT
IDS = {"gsm8k": ["a", "b"], "humaneval": ["HumanEval/0"]}


def _key(*overrides: str) -> str:
    cfg = load_config(ROOT / "params.yaml", "smoke", list(overrides))
    return setting_of(cfg, IDS, split="test", limit=2, data_manifest_sha256="d" * 64).key()


def test_precision_and_code_timeout_separate_settings_sampling_knobs_do_not():
    base = _key()
    assert _key("model.dtype=bfloat16") != base  # bf16 and fp32 decode differently (docs/benchmarks.md)
    resolved = _decoding_dtype("auto")  # float32 on a CPU, bfloat16 on a bf16 GPU
    assert resolved in ("float32", "bfloat16") and _key("model.dtype=auto") == _key(f"model.dtype={resolved}")
    assert _key("eval.code_timeout_s=5") != base  # a program needing 8 s passes at 10 s, fails at 5 s
    assert _key("mas.agents=2") != base
    assert _key("mas.temperature=0.9") == base and _key("mas.static_cache=true") == base
    cfg = load_config(ROOT / "params.yaml", "smoke", ["model.dtype=bfloat16"])
    setting = setting_of(cfg, IDS, split="test", limit=2, data_manifest_sha256=None)
    assert setting.params()["setting.dtype"] == "bfloat16" and "bfloat16" in setting.describe()
