"""The rank-side loop of a broadcast weight push: bucket by bucket, gather then broadcast,
with the gather of bucket i+1 running while bucket i is on the wire.

The two steps use different groups (the gather the trainer group, point to point into rank
0; the broadcast the weight-update group with the engines), so they can run at once: rank 0
starts bucket i's broadcast without waiting for it, gathers bucket i+1, and only then waits
for bucket i's broadcast and replies. Bucket i+1's request goes to the engines as soon as
they answered bucket i (see `BroadcastSender.announce`), so the engine is already in its
receive when the broadcast starts. Two buckets' payloads live on rank 0 at once.

Every rank gathers every bucket, in the same order, whatever happens on rank 0's side: a
failure there stops the broadcasts only, and is returned after the last gather.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from infra.trainer.gather import gather_full
from infra.weights.broadcast import BroadcastSender, Transfer

# one bucket as it was sent: names, full shapes, payload in the engines' dtype
SentBucket = tuple[list[str], list[list[int]], list[torch.Tensor]]


@dataclass
class PushResult:
    nbytes: int = 0
    gather_s: float = 0.0
    sent: list[SentBucket] = field(default_factory=list)  # only when asked to keep them
    # rank 0: every bucket's payload this push filled, in order (to reuse in a later push)
    payloads: list[list[torch.Tensor]] = field(default_factory=list)
    failed: Exception | None = None  # rank 0's first failure


@dataclass
class _InFlight:
    names: list[str]
    shapes: list[list[int]]
    transfer: Transfer


def push_buckets(
    params: dict[str, torch.Tensor],
    buckets: list[list[str]],
    sender: BroadcastSender | None,
    version: str,
    keep: bool,
    reuse: list[list[torch.Tensor]] | None = None,
) -> PushResult:
    """Gather every bucket (all ranks) and broadcast it from rank 0 (`sender`; None on the
    other ranks). `keep`: return the sent buckets (kept as they are, no copy). `reuse`: per
    bucket, an old payload to fill again where it fits (rank 0). A failure on rank 0 stops
    its broadcasts and is returned in `failed`, after all gathers."""
    result = PushResult()
    inflight: _InFlight | None = None

    def finish(bucket: _InFlight) -> None:
        try:
            result.nbytes += sender.finish(bucket.transfer)
        except Exception as exc:  # noqa: BLE001 - returned after the gathers
            result.failed = result.failed or exc  # the other ranks still gather: keep in step
        else:
            if keep:
                result.sent.append((bucket.names, bucket.shapes, bucket.transfer.payload))

    for i, names in enumerate(buckets):
        shapes = [list(params[name].shape) for name in names]  # a DTensor's is the full shape
        pending = payload = outs = None
        if sender is not None and result.failed is None:
            try:
                after = inflight.transfer.pending if inflight is not None else None
                pending = sender.announce(names, shapes, i == len(buckets) - 1, version, after)
                payload, outs = sender.allocate(shapes, reuse[i] if reuse and i < len(reuse) else None)
                result.payloads.append(payload)
            except Exception as exc:  # noqa: BLE001 - returned after the gathers
                result.failed, pending, outs = exc, None, None
        t0 = time.perf_counter()
        # every rank takes part; rank 0 gets the full values, cast, in the payload
        gather_full([params[name] for name in names], outs)
        result.gather_s += time.perf_counter() - t0
        if inflight is not None:  # the previous bucket, on the wire during that gather
            finish(inflight)
            inflight = None
        if pending is not None and result.failed is None:
            try:
                inflight = _InFlight(names, shapes, sender.start(pending, payload))
            except Exception as exc:  # noqa: BLE001 - returned after the gathers
                result.failed = exc
    if inflight is not None:
        finish(inflight)
    return result
