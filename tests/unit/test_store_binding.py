"""The rendezvous stores a run hosts listen on the address they advertise, not on every
interface (TCPStore's own choice whatever host it is given)."""

from __future__ import annotations

from datetime import timedelta

import psutil
import torch.distributed as dist

from infra.cluster.network import host_tcp_store
from infra.trainer.parallelize import host_store
from infra.weights.group import host_update_store


def listening_addresses(port: int) -> set[str]:
    return {
        c.laddr.ip
        for c in psutil.Process().net_connections("tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    }


def test_stores_listen_on_loopback_only_for_a_local_run() -> None:
    for store in (
        host_tcp_store("127.0.0.1", 2, 10),
        host_store("127.0.0.1", 2, 10),
        host_update_store("127.0.0.1", 2, 10),
    ):
        assert listening_addresses(store.port) == {"127.0.0.1"}
        peer = dist.TCPStore("127.0.0.1", store.port, 2, is_master=False, timeout=timedelta(seconds=10))
        store.set("who", "rank0")
        assert peer.get("who") == b"rank0"


def test_a_store_given_a_port_listens_on_it() -> None:
    first = host_tcp_store("127.0.0.1", 1, 10)
    port = first.port
    del first
    store = host_tcp_store("127.0.0.1", 1, 10, port=port)
    assert store.port == port and listening_addresses(port) == {"127.0.0.1"}
