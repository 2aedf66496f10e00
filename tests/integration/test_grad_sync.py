"""Bucketed gradient all-reduce: buckets start during the last backward, in order, in fp32.

One process with a one-rank gloo group: the all-reduce of one rank is the identity, so the
averaged gradients must equal the local ones exactly, and what is checked is *when* each bucket
starts. Averaging across real ranks is checked by tests/integration/test_distributed_cpu.py
(two ranks, torch engine, equal to a single-process reference).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import transformers

from components.config_sections import GspoConfig
from components.runtime.distributed import free_port, shutdown_distributed
from components.runtime.grad_sync import BucketedAllReduce, GradSyncError

VOCAB = 64


@pytest.fixture()
def gloo1(monkeypatch):
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, value)
    dist.init_process_group("gloo")
    yield
    shutdown_distributed()


def _model(dtype: torch.dtype = torch.float32) -> transformers.LlamaForCausalLM:
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).to(dtype)


def _loss(model: torch.nn.Module, seed: int = 0) -> torch.Tensor:
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(seed))  # [B=2, T=8]
    return model(input_ids=ids, labels=ids).loss


def test_buckets_start_during_the_armed_backward_and_average_exactly(gloo1) -> None:
    model = _model(torch.bfloat16)
    params = [p for p in model.parameters() if p.requires_grad]
    red = BucketedAllReduce(params, bucket_mb=0.01)  # ~2.6k fp32 elements: several buckets
    assert len(red.buckets) > 3
    assert sorted(i for b in red.buckets for i in b.indices) == list(range(len(params)))
    _loss(model, 1).backward()  # not armed (an earlier micro-batch): nothing starts
    assert red.launched == 0
    red.arm()
    _loss(model, 2).backward()
    assert red.launched == len(red.buckets)  # every bucket started before backward returned
    local = [p.grad.float().clone() for p in params]
    got: dict[int, torch.Tensor] = {}
    red.finish(lambda i, g: got.__setitem__(i, g.clone()))
    assert sorted(got) == list(range(len(params)))
    for i, g in got.items():
        assert g.dtype == torch.float32 and g.shape == params[i].shape
        torch.testing.assert_close(g, local[i], rtol=0, atol=0)
    assert red.launched == 0  # ready for the next update
    red.close()


def test_a_parameter_without_gradient_delays_only_its_bucket_and_counts_as_zero(gloo1) -> None:
    model = _model()
    params = list(model.parameters())
    red = BucketedAllReduce(params, bucket_mb=0.01)
    unused = model.model.embed_tokens.weight  # registered first: its bucket is the last one
    unused.requires_grad_(False)
    red.arm()
    _loss(model).backward()
    assert red.launched == len(red.buckets) - 1  # the buckets before it started in order
    unused.requires_grad_(True)
    got: dict[int, torch.Tensor] = {}
    red.finish(lambda i, g: got.__setitem__(i, g.clone()))
    idx = next(i for i, p in enumerate(params) if p is unused)
    assert torch.count_nonzero(got[idx]) == 0 and len(got) == len(params)
    red.close()


def test_a_second_gradient_after_the_bucket_started_is_an_error(gloo1) -> None:
    w = torch.nn.Parameter(torch.ones(4))
    red = BucketedAllReduce([w], bucket_mb=1.0)
    red.arm()
    (w * 2).sum().backward()
    assert red.launched == 1
    with pytest.raises(GradSyncError, match="second gradient"):
        (w * 3).sum().backward()
    red.reset()
    red.close()


def test_torch_engine_uses_buckets_only_with_peers() -> None:
    from components.runtime.engines import TorchEngine

    eng = TorchEngine(_model(), GspoConfig(lr=1e-3))
    assert eng._reducer is None  # one process, no process group: nothing to average
