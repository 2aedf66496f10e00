"""Shared helpers for the tracking tests (no tests here; imported by test_tracking_* modules).

* :func:`mlflow_uri` fixture: a ``sqlite:///`` URI in tmp_path, copied from a migrated
  template database. Creating and migrating a fresh MLflow database costs 4-11 s on a busy
  2-core machine; copying the template costs ~0.2 s. The template lives in the pytest cache
  (``.pytest_cache``), keyed by the MLflow version, so it is built once per checkout.
* :func:`build_tiny_hf_model`: a random LlamaForCausalLM + a BPE tokenizer trained on a few
  strings, saved with ``save_pretrained`` (~70 kB, well under the 1 MB budget).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import mlflow
import pytest
from helpers.paths import REPO_ROOT

CORPUS = ["the answer is 42", "agents talk less and say more", "silence is golden", "2 + 2 = 4"]


def template_db(cache_dir: Path) -> Path:
    """Path of a migrated, empty MLflow sqlite database (built on first use)."""
    from mlflow import MlflowClient

    target = cache_dir / f"mlflow-{mlflow.__version__}.db"
    if not target.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".db", dir=cache_dir)
        os.close(fd)
        os.unlink(tmp)
        client = MlflowClient(f"sqlite:///{tmp}")
        client.search_experiments()
        client.search_registered_models()
        os.replace(tmp, target)
    return target


@pytest.fixture()
def mlflow_uri(tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh ``sqlite:///`` tracking + registry URI; restores MLflow's global URI after.

    The test runs in ``tmp_path``: a sqlite store puts artifacts in ``./mlruns`` of the working directory."""
    store = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    cache = Path(store.mkdir("agent-gspo-mlflow")) if store else tmp_path.parent / "agent-gspo-mlflow"
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "mlflow.db"
    shutil.copy(template_db(cache), db)
    previous = mlflow.get_tracking_uri()
    yield f"sqlite:///{db}"
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(previous)


def build_tiny_hf_model(folder: Path, seed: int = 0) -> Path:
    """Save a tiny random Llama + BPE tokenizer into ``folder``; return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 5, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="</s>")
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         bos_token_id=1, eos_token_id=2, pad_token_id=2)
    LlamaForCausalLM(config).save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def save_tiny_chat_model(folder: Path, seed: int = 0) -> Path:
    """The tiny random ChatML policy of ``components.models.tiny`` saved as a trained folder would be."""
    from components.models.tiny import build_tiny_model

    model, tokenizer = build_tiny_model(seed=seed)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def system_settings(*overrides: str) -> dict:
    """Recorded training settings of a tiny system (``mas.*`` etc. overrides as ``section.key=value``)."""
    from components.config import load_config
    from components.tracking.served import system_settings as settings_of

    cfg = load_config(REPO_ROOT / "params.yaml", None,
                      ["model.name=tiny-random", "mas.agents=2", "mas.rounds=2", "mas.max_message_tokens=4",
                       *overrides])
    return settings_of(cfg, git_commit="c0ffee")
