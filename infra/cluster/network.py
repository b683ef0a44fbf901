"""Addresses processes advertise to each other."""

from __future__ import annotations

import socket


def advertise_address(local_cluster: bool) -> str:
    # A local cluster stays on loopback; on a real cluster peers reach us at the node IP.
    if local_cluster:
        return "127.0.0.1"
    import ray

    return ray.util.get_node_ip_address()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
