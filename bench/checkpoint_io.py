"""Checkpoint save/load through torch.distributed.checkpoint to S3, against a raw s3fs
put/get of the same bytes on the same server, measured side by side in one run.

    python -m bench.checkpoint_io [--hidden 512 --layers 4 --repeats 3]

Starts a moto S3 server on loopback (a real S3 HTTP API). The checkpoint is the real one:
two FSDP2 gloo ranks of TrainerRank (model, AdamW state, scheduler, RNG) writing shards
with FsspecWriter. The raw baseline uploads/downloads the very files DCP wrote, with one
s3fs `put`/`get` call (s3fs runs the transfers concurrently).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from bench.common import moto_s3, ratio_line
from tests.ports import free_port

ADDR = "127.0.0.1"


def _rank(rank: int, port: int, model_dir: str, uri: str, repeats: int, out: str) -> None:
    from infra.config import RunConfig
    from infra.trainer.rank import TrainerRank

    torch.set_num_threads(1)
    trainer = TrainerRank(RunConfig(), rank, 2)
    trainer.setup(model_dir, {}, ADDR, port)
    # one optimizer step so AdamW has its moments (the checkpoint's bulk)
    for p in trainer.model.parameters():
        p.grad = torch.zeros_like(p)
    trainer.optimizer.step()
    saves, loads = [], []
    for i in range(repeats):
        torch.distributed.barrier()
        t0 = time.perf_counter()
        trainer.save_checkpoint(f"{uri}/ckpt{i}", {})
        torch.distributed.barrier()
        saves.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        trainer.load_checkpoint(f"{uri}/ckpt{i}", {})
        torch.distributed.barrier()
        loads.append(time.perf_counter() - t0)
    if rank == 0:
        Path(out).write_text(json.dumps({"save": saves, "load": loads}))
    trainer.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import s3fs

    with moto_s3():
        fs = s3fs.S3FileSystem()
        with tempfile.TemporaryDirectory() as tmp:
            dcp = _dcp_times(Path(tmp), args.hidden, args.layers, args.repeats)
            nbytes, puts, gets = _raw_times(fs, Path(tmp), args.repeats)
    _report(dcp, puts, gets, nbytes, args.repeats)


def _dcp_times(tmp: Path, hidden: int, layers: int, repeats: int) -> dict[str, list[float]]:
    """Two FSDP2 ranks save and load their checkpoint to s3://bench/dcp; rank 0's times."""
    from infra.config import TinyModelConfig
    from infra.model.tiny import build_tiny_model

    shape = TinyModelConfig(hidden_size=hidden, num_layers=layers, intermediate_size=4 * hidden, num_heads=8)
    model_dir = build_tiny_model(tmp / "model", shape)
    out = tmp / "dcp.json"
    mp.start_processes(
        _rank,
        args=(free_port(), str(model_dir), "s3://bench/dcp", repeats, str(out)),
        nprocs=2,
        join=True,
    )
    return json.loads(out.read_text())


def _raw_times(fs, tmp: Path, repeats: int) -> tuple[int, list[float], list[float]]:
    """The bytes of the first checkpoint DCP wrote, and the times to put and get them raw."""
    local = tmp / "files"
    fs.invalidate_cache()
    fs.get("bench/dcp/ckpt0/", str(local) + "/", recursive=True)
    nbytes = sum(f.stat().st_size for f in local.rglob("*") if f.is_file())
    puts, gets = [], []
    for i in range(repeats):
        t0 = time.perf_counter()
        fs.put(str(local) + "/", f"bench/raw{i}/", recursive=True)
        puts.append(time.perf_counter() - t0)
        back = tmp / f"back{i}"
        fs.invalidate_cache()
        t0 = time.perf_counter()
        fs.get(f"bench/raw{i}/", str(back) + "/", recursive=True)
        gets.append(time.perf_counter() - t0)
    return nbytes, puts, gets


def _report(
    dcp: dict[str, list[float]], puts: list[float], gets: list[float], nbytes: int, repeats: int
) -> None:
    best = {
        k: min(v)
        for k, v in {
            "dcp_save": dcp["save"],
            "dcp_load": dcp["load"],
            "raw_put": puts,
            "raw_get": gets,
        }.items()
    }
    mib = nbytes / 2**20
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
    )
    print(f"checkpoint: {mib:.1f} MiB (model + AdamW + scheduler + RNG), 2 FSDP2 ranks, best of {repeats}")
    for k, v in best.items():
        print(f"  {k:9s} {v:7.3f} s  {mib / v:8.1f} MiB/s")
    print(f"save throughput vs raw put: {best['raw_put'] / best['dcp_save']:.2f}x (best of each)")
    print(f"load throughput vs raw get: {best['raw_get'] / best['dcp_load']:.2f}x (best of each)")
    save = [p / d for p, d in zip(puts, dcp["save"], strict=True)]
    load = [g / d for g, d in zip(gets, dcp["load"], strict=True)]
    print(ratio_line("checkpoint DCP save / raw s3fs put, throughput", save, ">= 0.5x"))
    print(ratio_line("checkpoint DCP load / raw s3fs get, throughput", load, ">= 0.5x"))


if __name__ == "__main__":
    main()
