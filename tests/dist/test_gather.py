"""The weight-sync gather against FSDP2's own `full_tensor()`, on 2 gloo ranks, with shapes
that split unevenly (and one whose second rank holds no rows)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.dist.ranks import spawn_ranks
from tests.ports import free_port

pytestmark = pytest.mark.dist


def _worker(rank: int, port: int, out: str) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from infra.trainer.gather import gather_full
    from infra.trainer.parallelize import init_distributed, parallelize

    torch.set_num_threads(1)
    init_distributed(rank, 2, "127.0.0.1", port, 120)
    torch.manual_seed(0)
    # vocab 1: the embedding's single row lives on rank 0 only; 5 and 3 rows split 3/2 and 2/1
    config = LlamaConfig(
        vocab_size=1,
        hidden_size=6,
        intermediate_size=5,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=False,
    )
    model = parallelize(LlamaForCausalLM(config).to(torch.bfloat16), 2)
    params = [p for _, p in model.named_parameters()]
    with torch.no_grad():
        outs = {}
        for dtype in (torch.float16, torch.bfloat16):  # cast on the way; in place
            mine = [torch.full(p.shape, float("nan"), dtype=dtype) for p in params] if rank == 0 else None
            gather_full(params, mine)
            outs[dtype] = mine
        gather_full(params, None)  # rank 0 may take part without outputs, in step
        expected = [p.full_tensor() for p in params]
    if rank == 0:
        shapes = [tuple(p.shape) for p in params]
        layouts = {(p.device_mesh.ndim, tuple(map(str, p.placements))) for p in params}
        torch.save(
            {"outs": outs, "expected": expected, "shapes": shapes, "layouts": layouts}, f"{out}/gather.pt"
        )


def test_gather_matches_full_tensor_with_uneven_shards(tmp_path: Path):
    spawn_ranks(_worker, free_port(), str(tmp_path))
    result = torch.load(tmp_path / "gather.pt")
    assert {(1, 6), (5, 6), (3, 6)} <= set(result["shapes"])
    assert result["layouts"] == {(1, ("S(0)",))}  # every one takes the one-gather path
    for dtype, outs in result["outs"].items():
        for got, want in zip(outs, result["expected"], strict=True):
            assert got.dtype == dtype and torch.equal(got, want.to(dtype))
