"""What the benches share: the settings both sides of ``train_step`` run, the weight-free models of
the real shapes, the prompts and reward, and the one result line every bench ends with.

Kept apart from ``train_step.py`` so the TRL peer (``_trl_peer.py``) and ``gpu_train.py`` import it
without importing the bench that launches them (no import cycle).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from components.data.item import Item
from components.errors import UserError


def ratio_line(bench: str, ours: float, peer: float, unit: str, target: float, digits: int = 2) -> str:
    """``bench <name>: ours <x> <unit>, peer <y> <unit>, ratio <r>x (target <t>x)``: the one line
    format every bench ends with (ratio = ours / peer, measured in the same run)."""
    ratio = ours / peer if peer > 0 else float("inf")
    return (f"bench {bench}: ours {_n(ours)} {unit}, peer {_n(peer)} {unit}, "
            f"ratio {ratio:.{digits}f}x (target {target:g}x)")


def sync(device: str | torch.device) -> None:
    """Wait for the device's queued work (CUDA); timings around GPU work need it. A no-op on CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _n(x: float) -> str:
    """At least 3 significant digits (a big model on CPU makes < 1 token/s)."""
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


MODELS = ("tiny-random", "smollm2-shape")
SMOLLM2_135M = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192, rope_theta=100000.0,
                    rms_norm_eps=1e-5, tie_word_embeddings=True)
"""SmolLM2-135M(-Instruct)'s architecture (its config.json), for a weight-free model of that shape."""


class BenchInputError(UserError):
    """A bench flag that cannot describe a valid run (names the flag)."""


@dataclass
class BenchSettings:
    """What both sides run; every field is printed as the settings line."""

    model: str = "tiny-random"
    """tiny-random or smollm2-shape (random init of SmolLM2-135M's config)"""
    device: str = "cpu"
    """cpu or cuda (bf16 on cuda, fp32 on cpu)"""
    questions: int = 4
    """prompts per step (Q)"""
    group: int = 8
    """completions per prompt (G): Q*G completions per generation batch"""
    tokens: int = 128
    """completion length, forced on both sides"""
    minibatches: int = 4
    """optimizer updates per generation batch"""
    steps: int = 3
    """timed steps (generation batches) after one warm-up step"""
    lr: float = 1e-6
    """AdamW learning rate (both sides)"""
    temperature: float = 1.0
    """sampling temperature (both sides)"""
    threads: int = 1
    """torch intra-op threads on CPU (tiny matmuls: 1 avoids contention on shared CPUs)"""
    seed: int = 0
    """weights and sampling seed"""
    data_dir: str = "data"
    """prepared data folder (gsm8k/train.parquet used when present)"""
    repeats: int = 2
    """ours/peer runs, alternated; each side's best run is reported (timeit's rule against noise)"""

    @property
    def completions(self) -> int:
        return self.questions * self.group

    @property
    def dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.device.startswith("cuda") else torch.float32

    def validate(self) -> None:
        if self.model not in MODELS:
            raise BenchInputError(f"--model {self.model!r}: allowed {', '.join(MODELS)}")
        for name in ("questions", "group", "tokens", "minibatches", "steps", "threads", "repeats"):
            if getattr(self, name) < 1:
                raise BenchInputError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.group < 2:
            raise BenchInputError(f"--group must be >= 2 (GSPO normalises within a group), got {self.group}")
        if self.completions % self.minibatches:
            raise BenchInputError(f"--questions x --group = {self.completions} completions must split evenly into "
                                  f"--minibatches {self.minibatches} (TRL needs equal per-step batches)")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise BenchInputError(f"--device {self.device}: CUDA is not available on this machine")


@dataclass
class SideResult:
    """Throughput of one side over its timed steps."""

    name: str
    tokens: int
    """generated completion tokens in the timed steps"""
    seconds: float
    """wall time of the timed steps (generation + scoring + old log-probs + updates)"""
    steps: int
    optimizer_steps: int
    cpu_seconds: float = 0.0
    """process CPU time of the timed steps: with 1 thread on a shared CPU, a figure that other
    processes' load barely moves (printed beside the wall-clock figure, not used in the ratio)"""
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_cpu_s(self) -> float:
        return self.tokens / self.cpu_seconds if self.cpu_seconds > 0 else 0.0


# ----------------------------------------------------------------------------- shared inputs

def letter_parity_reward(text: str) -> float:
    """1.0 when the completion has an even number of letters, else 0.0.

    Cheap and text-only, so both sides pay the same (negligible) scoring cost, yet it varies
    between samples: group advantages are non-zero and the updates do real work.
    """
    return float(sum(ch.isalpha() for ch in text) % 2 == 0)


def widen_tokenizer(tok: Any, vocab_size: int) -> Any:
    """The tiny ChatML tokenizer padded to ``vocab_size`` ids with filler tokens ``w<i>``.

    Why: a SmolLM2-shape model samples ids up to 49,151 while the tiny BPE knows 512; unknown ids
    decode to "", which our engine reads as whitespace/silence and TRL as empty text. Filler
    tokens give every id a short visible string, as a real 49k vocabulary would. Built from the
    tokenizer's JSON (merges untouched), so prompts tokenise exactly as before.
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from components.models.tiny import IM_END, IM_START, PAD, SILENCE_MARKER

    data = json.loads(tok.backend_tokenizer.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    next_id, i = max(vocab.values()) + 1, 0
    while next_id < vocab_size:
        name = f"w{i}"
        i += 1
        if name not in vocab:
            vocab[name] = next_id
            next_id += 1
    wide = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(data)), eos_token=IM_END, pad_token=PAD, bos_token=None,
        unk_token=None, additional_special_tokens=[IM_START, SILENCE_MARKER], padding_side="left",
        model_max_length=tok.model_max_length)
    wide.chat_template = tok.chat_template
    return wide


def build_policy(s: BenchSettings) -> tuple[Any, Any]:
    """A fresh model (same seed -> same weights on every call) and its tokenizer, on ``s.device``."""
    from components.models.tiny import build_tiny_model

    model, tok = build_tiny_model(seed=s.seed)
    if s.model == "smollm2-shape":
        from transformers import LlamaConfig, LlamaForCausalLM

        tok = widen_tokenizer(tok, SMOLLM2_135M["vocab_size"])
        config = LlamaConfig(**SMOLLM2_135M, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                             bos_token_id=None)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(s.seed)
            model = LlamaForCausalLM(config)
        for key in ("eos_token_id", "pad_token_id"):
            setattr(model.generation_config, key, getattr(tok, key))
        model.generation_config.bos_token_id = None
    return model.to(device=s.device, dtype=s.dtype).eval(), tok


def load_questions(n: int, data_dir: str) -> tuple[list[Item], str]:
    """``n`` GSM8K training records and where they came from (prepared parquet, else synthetic)."""
    path = Path(data_dir) / "gsm8k" / "train.parquet"
    if path.is_file():
        import pyarrow.parquet as pq

        rows = pq.read_table(path, columns=["id", "question", "answer"]).slice(0, n).to_pylist()
        source = f"{path} (first {len(rows)})"
    else:
        rows = [{"id": f"synthetic/{i}", "answer": str(3 * i + 8),
                 "question": f"Tom has {i + 3} apples and buys {2 * i + 5} more. How many apples does he have?"}
                for i in range(n)]
        source = "synthetic GSM8K-like questions (no prepared data/gsm8k/train.parquet)"
    items = [Item(id=str(r["id"]), benchmark="gsm8k", split="train", question=str(r["question"]),
                  answer=str(r["answer"]), answer_type="numeric") for r in rows]
    return items, source


def chat_prompt(item: Item) -> list[dict[str, str]]:
    """The exact system + user messages our single-agent (single_cot) engine frames for ``item``."""
    from components.mas.roles import system_prompt, task_family, user_prompt

    system = system_prompt(task_family(item.answer_type), "solver", 0, 1, allow_silence=False)
    return [{"role": "system", "content": system}, {"role": "user", "content": user_prompt(item)}]


def add_eval_flags(ap: argparse.ArgumentParser, *, items: int, repeats: int) -> None:
    """The flags both evaluation benches share (items, repeats, data, device, threads, benchmarks)."""
    ap.add_argument("--benchmarks", default=None, help="comma list (default: the profile's eval.benchmarks)")
    ap.add_argument("--items", type=int, default=items, help="items per benchmark")
    ap.add_argument("--repeats", type=int, default=repeats, help="runs per side, alternated; the best is reported")
    ap.add_argument("--data", default="data", help="prepared data folder")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads for both sides")


def timed_evaluation(cfg: Any, engine: Any, data: Path, items: int) -> tuple[Any, float]:
    """One greedy evaluation of ``engine`` as the ``agent_gspo`` system, outputs in a temporary folder;
    returns (EvalReport, wall seconds of rollouts + grading: report writing excluded)."""
    from components.evaluation import EvalRequest, System, evaluate

    with tempfile.TemporaryDirectory() as out:
        rep = evaluate(cfg, EvalRequest(limit=items, data_dir=data, out_dir=Path(out)), systems=[System("agent_gspo",
                       engine, greedy=True)])
    return rep, rep.timings["agent_gspo"] + rep.timings["grading"]
