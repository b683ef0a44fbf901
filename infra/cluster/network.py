"""Addresses processes advertise to each other."""

from __future__ import annotations


def advertise_address(local_cluster: bool) -> str:
    # A local cluster stays on loopback; on a real cluster peers reach us at the node IP.
    if local_cluster:
        return "127.0.0.1"
    import ray

    return ray.util.get_node_ip_address()
