"""The environment a run gives its Ray workers."""

from __future__ import annotations

import re

from flows.prefect_on_ray import worker_env
from infra.secrets import API_KEY_ENV


def test_each_run_gets_a_fresh_engine_key_sglang_can_read():
    """A key SGLang reads from its config file must not start with '-' (argparse would take it
    for a flag, tests/sglang/test_launch.py), so the run's key is hex."""
    keys = {worker_env("http://127.0.0.1:4200/api")[API_KEY_ENV] for _ in range(256)}
    assert len(keys) == 256
    assert all(re.fullmatch(r"[0-9a-f]{48}", key) for key in keys)
