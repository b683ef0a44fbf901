"""Trainer rank 0 built by SGLang's own code, driving an engine over HTTP (run in .venv-sglang).

As a trainer built on SGLang's helpers does it: post `/init_weights_update_group` to the
engine and join the group with `sglang.srt.utils.common.init_custom_process_group` as rank
0; open the update session; per tensor, post `/update_weights_from_distributed` and
broadcast the tensor; close the session; destroy the group on both sides.
The tensors are `randn` from a seeded generator, so the caller can make the same ones.

stdin: {"url", "api_key", "port", "group_name", "seed", "version", "tensors": [[name, shape], ...]}
stdout: {"ok": true}
"""

import json
import sys
import threading

import requests
import torch
import torch.distributed as dist
from sglang.srt.utils.common import init_custom_process_group


def main() -> None:
    spec = json.loads(sys.stdin.read())
    url, headers = spec["url"], {"Authorization": f"Bearer {spec['api_key']}"}

    def post(path: str, body: dict) -> dict:
        resp = requests.post(f"{url}{path}", json=body, headers=headers, timeout=120)
        resp.raise_for_status()
        return resp.json()

    join = threading.Thread(
        target=post,
        args=(
            "/init_weights_update_group",
            {
                "master_address": "127.0.0.1",
                "master_port": spec["port"],
                "rank_offset": 1,
                "world_size": 2,
                "group_name": spec["group_name"],
                "backend": "gloo",
            },
        ),
    )
    join.start()
    group = init_custom_process_group(
        backend="gloo",
        init_method=f"tcp://127.0.0.1:{spec['port']}",
        world_size=2,
        rank=0,
        group_name=spec["group_name"],
    )
    join.join()
    gen = torch.Generator().manual_seed(spec["seed"])
    post("/begin_weight_update", {})
    for name, shape in spec["tensors"]:
        tensor = torch.randn(shape, generator=gen)
        body = {
            "names": [name],
            "dtypes": ["float32"],
            "shapes": [shape],
            "group_name": spec["group_name"],
            "flush_cache": True,
            "weight_version": spec["version"],
        }
        answers: list[dict] = []
        request = threading.Thread(
            target=lambda b=body, out=answers: out.append(post("/update_weights_from_distributed", b))
        )
        request.start()  # the engine answers once the broadcast arrived and loaded
        dist.broadcast(tensor, src=0, group=group)
        request.join()
        assert answers and answers[0].get("success") is not False, answers
    post("/end_weight_update", {})
    post("/destroy_weights_update_group", {"group_name": spec["group_name"]})
    dist.destroy_process_group(group)
    print(json.dumps({"ok": True}))


if __name__ == "__main__":
    main()
