"""A free port for a test's or a benchmark's own server or process group.

Racy by nature (another process may take the port before the caller binds it), so the
project's own code never does this: its servers and stores bind port 0 and report the
port they got. Tests use it where a program must be given a port number up front.
"""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
