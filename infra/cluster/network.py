"""Addresses processes advertise to each other, and the stores they meet at."""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch.distributed as dist


def advertise_address(local_cluster: bool) -> str:
    # A local cluster stays on loopback; on a real cluster peers reach us at the node IP.
    if local_cluster:
        return "127.0.0.1"
    import ray

    return ray.util.get_node_ip_address()


def host_tcp_store(host: str, world_size: int, timeout_s: float, port: int = 0) -> dist.TCPStore:
    """A rendezvous store that listens on `host` only, on `port` (0: one the OS picks; tell
    the other ranks `store.port`).

    TCPStore binds every interface whatever host it is given; handed a socket already bound
    to `host`, it listens there instead. A local run's stores are then reachable from this
    machine only (127.0.0.1), a cluster run's at the node IP that the peers were told. The
    socket is bound and listening before any peer hears of its port, so nothing can take the
    port between a probe and the bind.
    """
    import torch.distributed as dist  # noqa: PLC0415 - the flow's process imports this module without torch

    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind(address)
        sock.listen(1024)
        bound_port = sock.getsockname()[1]
        store = dist.TCPStore(
            host,
            bound_port,
            world_size,
            is_master=True,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
            master_listen_fd=sock.fileno(),
        )
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store's server owns the descriptor now
    return store
