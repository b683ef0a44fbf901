"""An engine rank of the weight-update group, built by SGLang's own code (run in .venv-sglang).

Joins with `sglang.srt.utils.common.init_custom_process_group` as SGLang's model runner
does (rank = rank_offset + tp_rank), receives each tensor of the bucket with
`torch.distributed.broadcast(t, src=0, group=pg)` (or, for a group with
`"load_format": "flattened_bucket"`, the whole bucket as SGLang's own FlattenedTensorBucket
buffer), saves what arrived, destroys the group.
It does that for each group named in the spec, in order.

usage: engine_rank.py SPEC_JSON OUT_PREFIX
spec: {"address", "world_size", "rank_offset", "tp_rank", "groups": [{"name", "port", "tensors": [[dtype, shape], ...], "load_format"?}]}
"""

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from sglang.srt.utils.common import init_custom_process_group
from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket


def main() -> None:
    spec = json.loads(sys.argv[1])
    for group in spec["groups"]:
        pg = init_custom_process_group(
            backend="gloo",
            init_method=f"tcp://{spec['address']}:{group['port']}",
            world_size=spec["world_size"],
            rank=spec["rank_offset"] + spec["tp_rank"],  # as SGLang's model runner counts
            group_name=group["name"],
            timeout=timedelta(seconds=60),
        )
        received = []
        if group.get("load_format") == "flattened_bucket":
            # as SGLang's weight updater receives that format: one buffer, then views
            specs = group["tensors"]
            names = [f"t{i}" for i in range(len(specs))]
            bucket = FlattenedTensorBucket.empty(names, [d for d, _ in specs], [s for _, s in specs], "cpu")
            dist.broadcast(bucket.get_flattened_tensor(), src=0, group=pg)
            received = [tensor.clone() for _, tensor in bucket.reconstruct_tensors()]
        for dtype, shape in [] if received else group["tensors"]:
            tensor = torch.empty(shape, dtype=getattr(torch, dtype))
            dist.broadcast(tensor, src=0, group=pg)
            received.append(tensor)
        torch.save(received, f"{sys.argv[2]}-{group['name']}.pt")
        dist.destroy_process_group(pg)
    print("done", flush=True)


if __name__ == "__main__":
    main()
