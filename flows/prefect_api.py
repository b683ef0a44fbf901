"""Where the run's Prefect API is, for processes that are not the flow's own."""

from __future__ import annotations

import os
import secrets

from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import PREFECT_API_KEY, PREFECT_API_URL

from infra.rollout.client import API_KEY_ENV


def ensure_api_server() -> str:
    """Use the configured API, or start a local one that Ray workers can reach.

    Prefect's in-process ephemeral API is invisible to other processes, so task runs on
    Ray workers would log nowhere; a subprocess server on loopback is shared by all.
    """
    url = PREFECT_API_URL.value()
    if url:
        return url
    # the local server has no network to report usage to; don't let it try
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    server = SubprocessASGIServer()
    # Prefect waits 20 s by default; a busy 2-core machine (a CI run, other jobs) can need more
    server.start(timeout=120)
    os.environ["PREFECT_API_URL"] = server.api_url
    return server.api_url


def worker_env() -> dict[str, str]:
    """Environment of the run's Ray workers: the flow run's API (so task runs report to it)
    and a fresh per-run engine API key (engines answer only clients that send it)."""
    url = PREFECT_API_URL.value() or os.environ.get("PREFECT_API_URL")
    server = SubprocessASGIServer()
    if not url and server.running:
        url = server.api_url
    if not url:
        raise RuntimeError("no Prefect API URL: run through `python -m flows.train` or set PREFECT_API_URL")
    env = {"PREFECT_API_URL": url, API_KEY_ENV: secrets.token_urlsafe(24)}
    key = PREFECT_API_KEY.value()
    if key:
        env["PREFECT_API_KEY"] = key.get_secret_value() if hasattr(key, "get_secret_value") else str(key)
    return env
