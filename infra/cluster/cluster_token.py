"""A token that the local Ray cluster of a run demands from everyone who connects.

Ray's GCS, raylet, agents and workers listen on every interface, and Ray has no setting
that binds them to loopback. What it has is token authentication: with RAY_AUTH_MODE=token
and RAY_AUTH_TOKEN in the environment of the processes that start the cluster, every Ray
RPC must carry the token; a driver, a `ray` command or a client elsewhere on the network
without it is refused. The cluster's processes inherit the token from this process's
environment; Ray writes it to no file and no log.

Ray reads the mode once, when it is imported, so the environment must hold it before
`import ray` in this process: a process that imported Ray first keeps Ray's default
(no token), or its own cluster would refuse it.
"""

from __future__ import annotations

import os
import secrets
import sys


def require_cluster_token() -> bool:
    """Turn token authentication on for the Ray clusters this process starts; True if it is on.

    A RAY_AUTH_MODE the user set stands (and their token with it); a process that already
    imported Ray is left as it is.
    """
    if os.environ.get("RAY_AUTH_MODE"):
        return os.environ["RAY_AUTH_MODE"] == "token"
    if "ray" in sys.modules:
        return False
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    os.environ["RAY_AUTH_MODE"] = "token"
    return True
