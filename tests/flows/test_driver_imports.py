"""The flow's own process never imports torch on the demo: its actors' modules, the
tokenizer check and the tiny model (from the machine's cache, built in the test's own cache
first) need none of it (docs/LOOP.md, start-up). And the command starts the run's actors
while the Prefect API server boots, before the flow run exists (flows/early_start.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from infra.config import TinyModelConfig
from infra.model.loading import tiny_model_dir

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.flow

RUN = textwrap.dedent(
    """
    import sys
    from flows.train import main

    rc = main(sys.argv[1:])
    print("result", rc, "torch" in sys.modules, "transformers.models.llama.modeling_llama" in sys.modules)
    """
)


def test_a_demo_run_leaves_the_flows_process_without_torch(tmp_path):
    cache = tmp_path / "cache"
    tiny_model_dir(TinyModelConfig(), str(cache))  # a warm machine: the model was built before
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    env["PRL_CACHE_DIR"] = str(cache)
    args = ["num_rollout=1", f"storage.uri={tmp_path / 'runs'}", "checkpoint.resume=fresh"]
    out = subprocess.run(
        [sys.executable, "-c", RUN, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    result = [line for line in out.stdout.splitlines() if line.startswith("result ")]
    assert result == ["result 0 False False"], out.stdout[-2000:]
    marks = json.loads((tmp_path / "runs" / "tiny-demo" / "startup.json").read_text())["marks_unix"]
    assert marks["preflight"] < marks["placement_groups"] < marks["flow_run_started"] < marks["first_sync"]
    assert "actors: started by the command" in out.stderr  # the flow run took them, started none
    assert "iter 0000 |" in out.stderr  # and ran the loop on them
