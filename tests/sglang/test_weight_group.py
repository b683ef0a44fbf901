"""Trainer rank 0 (our `open_update_group` + `broadcast`) against engine ranks built by SGLang's
own `init_custom_process_group`, receiving as SGLang's model runner does; bitwise equality."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from infra.weights.broadcast import pack
from infra.weights.group import broadcast, close_update_group, host_update_store, open_update_group
from tests.sglang.conftest import spawn

pytestmark = pytest.mark.sglang

BUCKET = [  # a real bucket: several tensors, mixed dtypes, bfloat16 among them
    ("bfloat16", [64, 32]),
    ("float32", [32]),
    ("float16", [8, 4, 2]),
    ("bfloat16", [1]),
    ("int64", [5]),
]


# what BroadcastSender sends as one flattened_bucket: every tensor in the engines' dtype
FLAT_BUCKET = [("bfloat16", [64, 32]), ("bfloat16", [32]), ("bfloat16", [8, 4, 2]), ("bfloat16", [1])]


def _bucket(seed: int, spec: list = BUCKET) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for dtype, shape in spec:
        if dtype == "int64":
            out.append(torch.randint(-(2**40), 2**40, shape, generator=gen))
        else:
            out.append(torch.randn(shape, generator=gen).to(getattr(torch, dtype)))
    return out


def _trainer(store, world_size: int, name: str, tensors: list[torch.Tensor], flat: bool) -> None:
    # as BroadcastSender: rank 0 joins through the store it bound before the engines heard its port
    group = open_update_group(
        "127.0.0.1", store.port, rank=0, world_size=world_size, group_name=name, timeout_s=120, store=store
    )
    for tensor in [pack(tensors, tensors[0].dtype)] if flat else tensors:
        broadcast(group, tensor, src=0)
    close_update_group(group)


@pytest.mark.parametrize(
    "engine_ranks",  # (rank_offset, tp_rank) of each SGLang process
    [pytest.param([(1, 0), (2, 0)], id="2-engines"), pytest.param([(1, 0), (1, 1)], id="1-engine-tp-2")],
)
def test_bucket_arrives_bitwise_then_a_second_group(sglang_python: str, tmp_path: Path, engine_ranks):
    world_size = 1 + len(engine_ranks)
    stores = [host_update_store("127.0.0.1", world_size, 120) for _ in range(3)]
    groups = [
        {"name": f"wu-{tmp_path.name}-a", "store": stores[0], "seed": 0, "tensors": BUCKET},
        {"name": f"wu-{tmp_path.name}-b", "store": stores[1], "seed": 1, "tensors": BUCKET},
        # our sender's flattened_bucket, received by SGLang's own FlattenedTensorBucket
        {
            "name": f"wu-{tmp_path.name}-c",
            "store": stores[2],
            "seed": 2,
            "tensors": FLAT_BUCKET,
            "flat": True,
        },
    ]
    spec = {
        "address": "127.0.0.1",
        "world_size": world_size,
        "groups": [
            {
                "name": g["name"],
                "port": g["store"].port,
                "tensors": g["tensors"],
                "load_format": "flattened_bucket" if g.get("flat") else None,
            }
            for g in groups
        ],
    }
    procs = [
        spawn(
            sglang_python,
            "engine_rank.py",
            json.dumps({**spec, "rank_offset": offset, "tp_rank": tp_rank}),
            str(tmp_path / f"rank{offset + tp_rank}"),
        )
        for offset, tp_rank in engine_ranks
    ]
    ranks = [offset + tp_rank for offset, tp_rank in engine_ranks]
    try:
        with ThreadPoolExecutor(1) as pool:
            # the first group is destroyed on every side before the second one opens
            for g in groups:
                sent = _bucket(g["seed"], g["tensors"])
                flat = bool(g.get("flat"))
                pool.submit(_trainer, g["store"], world_size, g["name"], sent, flat).result(timeout=240)
        for proc in procs:
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0, out[-6000:]
    finally:
        for proc in procs:
            proc.kill()
    for g in groups:
        sent = _bucket(g["seed"], g["tensors"])
        for r in ranks:
            got = torch.load(tmp_path / f"rank{r}-{g['name']}.pt")
            assert [t.dtype for t in got] == [t.dtype for t in sent]
            for a, b in zip(got, sent, strict=True):
                assert a.shape == b.shape and a.view(torch.uint8).equal(b.view(torch.uint8))
