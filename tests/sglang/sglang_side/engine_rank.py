"""An engine rank of the weight-update group, built by SGLang's own code (run in .venv-sglang).

Joins with `sglang.srt.utils.common.init_custom_process_group` as SGLang's model runner
does (rank = rank_offset + tp_rank), receives each tensor of the bucket with
`torch.distributed.broadcast(t, src=0, group=pg)`, saves what arrived, destroys the group.
It does that for each group named in the spec, in order.

usage: engine_rank.py SPEC_JSON OUT_PREFIX
spec: {"address", "world_size", "rank_offset", "tp_rank", "groups": [{"name", "port", "tensors": [[dtype, shape], ...]}]}
"""

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from sglang.srt.utils.common import init_custom_process_group


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
        for dtype, shape in group["tensors"]:
            tensor = torch.empty(shape, dtype=getattr(torch, dtype))
            dist.broadcast(tensor, src=0, group=pg)
            received.append(tensor)
        torch.save(received, f"{sys.argv[2]}-{group['name']}.pt")
        dist.destroy_process_group(pg)
    print("done", flush=True)


if __name__ == "__main__":
    main()
