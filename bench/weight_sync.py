"""Weight sync (the broadcast transport's push) against a raw broadcast of the same bytes.

    python -m bench.weight_sync [--repeats 3]

Two FSDP2 gloo ranks of TrainerRank on the tiny demo model push their weights to a running
built-in engine server: full-tensor gathers, the update session, one
`/update_weights_from_distributed` request and one broadcast per tensor (SGLang's engines
receive tensor by tensor), and the engine loading them. The baseline, in the same run: rank
0 opens a second group, by the same recipe and backend, with a bare receiver process, and
broadcasts one flat tensor per bucket of the same byte sizes; no HTTP, no gathers, no
loading. The engine server cannot take raw bytes (it speaks SGLang's protocol), so the
baseline's far end is that receiver, not the engine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from bench.common import ratio_line, spread
from infra.cluster.network import free_port

ADDR = "127.0.0.1"


def _bucket_bytes(trainer) -> list[int]:
    from infra.weights.buckets import bucket_params

    params = dict(trainer.model.named_parameters())
    sizes = {n: p.numel() * p.element_size() for n, p in params.items()}
    buckets = bucket_params(list(sizes.items()), int(trainer.cfg.weight_sync.bucket_size_mb * 2**20))
    return [sum(sizes[n] for n in names) for names in buckets]


def _worker(index: int, ports: tuple[int, int], model_dir: str, url: str, repeats: int, out: str) -> None:
    from infra.config import RunConfig
    from infra.weights.group import broadcast, close_update_group, open_update_group

    torch.set_num_threads(1)
    raw_port = ports[1]
    if index == 2:  # the bare receiver of the raw baseline
        group = open_update_group(ADDR, raw_port, 1, 2, group_name="raw-baseline")
        meta = torch.zeros(1, dtype=torch.long)
        broadcast(group, meta, src=0)
        sizes = torch.zeros(int(meta), dtype=torch.long)
        broadcast(group, sizes, src=0)
        for _ in range(repeats):
            for n in sizes.tolist():
                broadcast(group, torch.empty(n // 4, dtype=torch.float32), src=0)
            broadcast(group, torch.ones(1), src=1)  # received: the sender's clock stops here
        close_update_group(group)
        return
    from infra.trainer.rank import TrainerRank

    trainer = TrainerRank(RunConfig(), index, 2)
    trainer.setup(model_dir, {}, ADDR, ports[0])
    trainer.connect_engines([url])
    trainer.open_weight_group("bench-sync")
    pushes = []
    for v in range(repeats):
        torch.distributed.barrier()
        t0 = time.perf_counter()
        stats = trainer.update_weights(v + 1)
        torch.distributed.barrier()
        pushes.append(time.perf_counter() - t0)
    trainer.close_weight_group()
    if index == 0:
        sizes = _bucket_bytes(trainer)
        group = open_update_group(ADDR, raw_port, 0, 2, group_name="raw-baseline")
        broadcast(group, torch.tensor([len(sizes)]), src=0)
        broadcast(group, torch.tensor(sizes), src=0)
        flats = [torch.randn(n // 4) for n in sizes]
        raws = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for flat in flats:
                broadcast(group, flat, src=0)
            broadcast(group, torch.zeros(1), src=1)
            raws.append(time.perf_counter() - t0)
        close_update_group(group)
        result = {"push": pushes, "raw": raws, "bytes": stats["bytes"], "buckets": stats["num_buckets"]}
        Path(out).write_text(json.dumps(result))
    trainer.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from infra.config import TinyModelConfig
    from infra.model.tiny import build_tiny_model
    from infra.rollout.engine import launch_engine, stop_engine, wait_until_healthy

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model", TinyModelConfig())
        port = free_port()
        proc = launch_engine("torch", str(model_dir), ADDR, port, seed=0, threads=1)
        url = f"http://{ADDR}:{port}"
        try:
            wait_until_healthy(url, proc, 120)
            out = str(Path(tmp) / "result.json")
            ports = (free_port(), free_port())
            mp.start_processes(
                _worker, args=(ports, str(model_dir), url, args.repeats, out), nprocs=3, join=True
            )
            result = json.loads(Path(out).read_text())
        finally:
            stop_engine(proc)
    mib = result["bytes"] / 2**20
    print(
        f"tiny demo model: {mib:.2f} MiB in {result['buckets']} bucket(s); 2 FSDP2 ranks -> 1 built-in engine"
    )
    print(f"push (transport)      s: {spread(result['push'], '{:.4f}')}")
    print(f"raw flat broadcast    s: {spread(result['raw'], '{:.4f}')}")
    print(f"push throughput: {mib / statistics.median(result['push']):.1f} MiB/s")
    ratios = [p / r for p, r in zip(result["push"], result["raw"], strict=True)]
    print(ratio_line("weight sync push / raw broadcast of the same bytes, time", ratios, "<= 2x"))


if __name__ == "__main__":
    main()
