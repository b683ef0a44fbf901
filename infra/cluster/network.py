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
    """A port that was free a moment ago. Another process may take it before the caller
    binds it, so only a program that must be given a port number to bind (an engine
    server's command line) gets one this way; a store or socket this process owns binds
    port 0 itself and reads the port back."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
