"""Weight sync (the broadcast transport's push) against a raw broadcast of the same bytes.

    python -m bench.weight_sync [--repeats 3] [--hidden-size 384 --layers 4 --intermediate-size 1536]
        [--bucket-size-mb MB] [--models both|tiny|larger]

Two FSDP2 gloo ranks of TrainerRank push their weights to a running built-in engine server:
the update session (its begin runs beside the first gather), per bucket one
`/update_weights_from_distributed` request (posted before the bucket's gather, so the two
overlap), the gather (rank 1 sends rank 0 its shards, into rank 0's send buffer), the
broadcast (one flat buffer per bucket, SGLang's `flattened_bucket` format; it runs while
the next bucket is gathered), and the engine loading them. The baseline, in the same run
and right after each push: rank 0 holds a second group, by the same recipe and backend,
with a bare receiver process, and broadcasts one flat tensor per bucket of the same byte
sizes from buffers it allocated once; no HTTP, no gathers, no loading. The engine server
cannot take raw bytes (it speaks SGLang's protocol), so the baseline's far end is that
receiver, not the engine.

Steady state is measured: the first WARMUP rounds (push and raw broadcast) are not timed.
A run syncs many times, and on CPU rank 0 fills again the payload buffers of the push
before the one it keeps, so its third push is the first to find them.

Two models, each in its own run: the tiny demo model (0.55 MiB, where one HTTP round trip
outweighs the bytes) and a larger one of the same family (the `--hidden-size/--layers/
--intermediate-size` shape, 36 MiB by default) where the bytes matter. For each, the
median time of every phase of the push is printed (rank 0's side and the engine's own);
`broadcast` and `reply wait` are what rank 0 waited for after its gathers, not the part of
a broadcast that ran beside the next gather.
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
from infra.config import TinyModelConfig
from tests.ports import free_port

ADDR = "127.0.0.1"
# Untimed rounds first: a run syncs hundreds of times, and rank 0 fills the payload buffers
# of the push before the one it keeps (CPU), so its third push is the first in steady state.
WARMUP = 2


def _bucket_bytes(trainer) -> list[int]:
    from infra.weights.buckets import bucket_params

    params = dict(trainer.model.named_parameters())
    sizes = {n: p.numel() * p.element_size() for n, p in params.items()}
    buckets = bucket_params(list(sizes.items()), int(trainer.cfg.weight_sync.bucket_size_mb * 2**20))
    return [sum(sizes[n] for n in names) for names in buckets]


def _worker(
    index: int,
    ports: tuple[int, int],
    model_dir: str,
    url: str,
    repeats: int,
    out: str,
    bucket_mb: float | None,
) -> None:
    """Process `index`: trainer ranks 0 and 1 push (rank 0 also sends the raw baseline), 2
    receives the baseline."""
    from infra.config import RunConfig

    torch.set_num_threads(1)
    if index == 2:
        _raw_receiver(ports[1], repeats)
        return
    from infra.trainer.rank import TrainerRank

    overrides = {} if bucket_mb is None else {"weight_sync": {"bucket_size_mb": bucket_mb}}
    trainer = TrainerRank(RunConfig(**overrides), index, 2)
    trainer.setup(model_dir, {}, ADDR, ports[0])
    trainer.connect_engines([url])
    trainer.open_weight_group("bench-sync")
    raw = _RawSender(trainer, ports[1]) if index == 0 else None
    pushes, phases = [], []
    # each repeat times a push, then the raw broadcast right after it: both under the same
    # load from whatever else shares the machine; the first WARMUP rounds are not recorded
    for v in range(WARMUP + repeats):
        torch.distributed.barrier()
        t0 = time.perf_counter()
        stats = trainer.update_weights(v + 1)
        torch.distributed.barrier()
        push_s = time.perf_counter() - t0
        raw_s = raw.send() if raw is not None else None
        if v < WARMUP:
            continue
        pushes.append(push_s)
        phases.append({k: val for k, val in stats.items() if k.startswith("time_sync_")})
        if raw is not None:
            raw.times.append(raw_s)
    trainer.close_weight_group()
    if raw is not None:
        raw.close()
        result = {
            "push": pushes,
            "raw": raw.times,
            "phases": phases,
            "bytes": stats["bytes"],
            "buckets": stats["num_buckets"],
        }
        Path(out).write_text(json.dumps(result))
    trainer.shutdown()


def _raw_receiver(port: int, repeats: int) -> None:
    """The bare far end of the raw baseline: receives what `_RawSender` sends, every round."""
    from infra.weights.group import broadcast, close_update_group, open_update_group

    group = open_update_group(ADDR, port, 1, 2, group_name="raw-baseline")
    meta = torch.zeros(1, dtype=torch.long)
    broadcast(group, meta, src=0)
    sizes = torch.zeros(int(meta), dtype=torch.long)
    broadcast(group, sizes, src=0)
    for _ in range(WARMUP + repeats):
        for n in sizes.tolist():
            broadcast(group, torch.empty(n // 4, dtype=torch.float32), src=0)
        broadcast(group, torch.ones(1), src=1)  # received: the sender's clock stops here
    close_update_group(group)


class _RawSender:
    """Rank 0's side of the raw baseline: one flat tensor per bucket of the push's byte
    sizes, from buffers allocated once, over a group of its own."""

    def __init__(self, trainer, port: int) -> None:
        from infra.weights.group import broadcast, open_update_group

        sizes = _bucket_bytes(trainer)
        self.group = open_update_group(ADDR, port, 0, 2, group_name="raw-baseline")
        broadcast(self.group, torch.tensor([len(sizes)]), src=0)
        broadcast(self.group, torch.tensor(sizes), src=0)
        self.flats = [torch.randn(n // 4) for n in sizes]
        self.times: list[float] = []

    def send(self) -> float:
        """One round: every bucket, then the receiver's answer; the seconds it took."""
        from infra.weights.group import broadcast

        t0 = time.perf_counter()
        for flat in self.flats:
            broadcast(self.group, flat, src=0)
        broadcast(self.group, torch.zeros(1), src=1)
        return time.perf_counter() - t0

    def close(self) -> None:
        from infra.weights.group import close_update_group

        close_update_group(self.group)


# the printed phases: label, key of the stats update_weights returns (rank 0)
PHASES = [
    ("session begin (in the background)", "time_sync_session_begin_s"),
    ("announce (post)", "time_sync_announce_s"),
    ("gathers", "time_sync_gather_s"),
    ("pack", "time_sync_pack_s"),
    ("broadcast", "time_sync_broadcast_s"),
    ("reply wait", "time_sync_reply_wait_s"),
    ("session end", "time_sync_session_end_s"),
]
ENGINE_PHASES = [
    ("receive", "time_sync_engine_time_receive_s"),
    ("load", "time_sync_engine_time_load_s"),
]


def _run(shape: TinyModelConfig, repeats: int, bucket_mb: float | None) -> dict:
    from infra.engines.launch import launch_engine, stop_engine, wait_until_healthy
    from infra.model.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model", shape)
        port = free_port()
        proc = launch_engine("torch", str(model_dir), ADDR, port, seed=0, threads=1)
        url = f"http://{ADDR}:{port}"
        try:
            wait_until_healthy(url, proc, 120)
            out = str(Path(tmp) / "result.json")
            ports = (free_port(), free_port())
            mp.start_processes(
                _worker, args=(ports, str(model_dir), url, repeats, out, bucket_mb), nprocs=3, join=True
            )
            return json.loads(Path(out).read_text())
        finally:
            stop_engine(proc)


def _median_phase(result: dict, key: str) -> float:
    return statistics.median(p.get(key, 0.0) for p in result["phases"])


def _report(title: str, result: dict, ratio_label: str) -> None:
    mib = result["bytes"] / 2**20
    print(f"{title}: {mib:.2f} MiB in {result['buckets']} bucket(s); 2 FSDP2 ranks -> 1 built-in engine")
    print(f"push (transport)      s: {spread(result['push'], '{:.4f}')}")
    print(f"raw flat broadcast    s: {spread(result['raw'], '{:.4f}')}")
    print(f"push throughput: {mib / statistics.median(result['push']):.1f} MiB/s")
    named = [(label, _median_phase(result, key)) for label, key in PHASES]
    # the session begin and the post run beside the gathers: not on the push's path
    accounted = sum(t for label, t in named if "background" not in label)
    other = statistics.median(result["push"]) - accounted
    print("  rank 0, median s: " + ", ".join(f"{label} {t:.4f}" for label, t in named))
    print(f"  rest of the push (bucketing, the bench's barrier, threads): {other:.4f}")
    engine = ", ".join(f"{label} {_median_phase(result, key):.4f}" for label, key in ENGINE_PHASES)
    print(f"  engine handler, median s: {engine} (inside rank 0's reply wait and broadcast)")
    ratios = [p / r for p, r in zip(result["push"], result["raw"], strict=True)]
    print(ratio_line(ratio_label, ratios, "<= 2x"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hidden-size", type=int, default=384, help="the larger model's width")
    ap.add_argument("--layers", type=int, default=4, help="the larger model's decoder layers")
    ap.add_argument("--intermediate-size", type=int, default=1536, help="the larger model's MLP width")
    ap.add_argument(
        "--bucket-size-mb",
        type=float,
        default=None,
        help="weight_sync.bucket_size_mb (default: the config's)",
    )
    ap.add_argument("--models", choices=["both", "tiny", "larger"], default="both")
    args = ap.parse_args()
    tiny = TinyModelConfig()
    larger = TinyModelConfig(
        hidden_size=args.hidden_size, num_layers=args.layers, intermediate_size=args.intermediate_size
    )
    runs = {"tiny": args.models in ("both", "tiny"), "larger": args.models in ("both", "larger")}
    tiny_result = _run(tiny, args.repeats, args.bucket_size_mb) if runs["tiny"] else None
    larger_result = _run(larger, args.repeats, args.bucket_size_mb) if runs["larger"] else None
    if tiny_result is not None:
        _report("tiny demo model", tiny_result, "weight sync push / raw broadcast of the same bytes, time")
    if larger_result is not None:
        shape = f"hidden {larger.hidden_size}, {larger.num_layers} layers, mlp {larger.intermediate_size}"
        _report(
            f"larger model ({shape})",
            larger_result,
            "weight sync push / raw broadcast of the same bytes, larger model, time",
        )


if __name__ == "__main__":
    main()
