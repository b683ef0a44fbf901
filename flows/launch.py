"""The flow from a shell:

    python -m flows.train                               # the tiny CPU demo
    python -m flows.train --config FILE.yaml key.path=value ...

reads the config from the command line, starts a Prefect API server and a Ray cluster for
the run, then runs the flow. A deployment's run skips all of this: its worker calls the
flow function itself, against the API and the cluster it has.
"""

from __future__ import annotations

import argparse
import importlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from prefect import Flow

from flows import early_start
from flows.prefect_on_ray import ApiServerStart, worker_env
from infra import startup
from infra.cluster.ray_cluster import ray_session
from infra.config import RunConfig
from infra.config_files import load_config
from infra.heap import freeze_startup_heap
from infra.preflight import already_finished

if TYPE_CHECKING:
    from infra.system import RLSystem

# What the flow's process imports for RLSystem.start and the preflight; `launch` loads it
# beside Ray's start. No torch: the tiny model comes from the machine's cache once built.
PRELOAD = ["infra.system", "transformers.tokenization_utils_fast"]


def _preload() -> None:
    """Import what the flow's start needs (the actor classes, the tokenizer code)
    while Ray starts; a later import of the same module waits for this one, never repeats it."""
    for module in PRELOAD:
        importlib.import_module(module)


def launch(
    train: Flow,
    argv: list[str] | None,
    description: str,
    prog: str = "python -m flows.train",
    finished: Callable[[RunConfig], str | None] | None = already_finished,
    system: Callable[[RunConfig, dict[str, str]], RLSystem] | None = None,
) -> int:
    """Parse `[--config FILE] key.path=value ...`, start what the run needs and run `train`;
    the process's exit status (0 when the flow run completed). `finished` says why there is
    nothing to do (then nothing starts); None: always run. `system` makes the run's system
    (given its workers' environment), which then starts while the API server boots
    (flows/early_start.py)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", help="YAML file with RunConfig fields")
    parser.add_argument("overrides", nargs="*", help="key.path=value settings applied after the file")
    args = parser.parse_args(argv)
    config = load_config(args.config, args.overrides)  # fails here, before anything starts
    startup.mark("config")
    done = finished(config) if finished is not None else None  # nothing to do: start neither Ray nor the API
    if done:
        print(done, flush=True)
        return 0
    # Start-up work that does not depend on each other runs side by side: the Prefect API
    # server boots in its process, the trainer/engine code imports in a thread, Ray starts here.
    api = ApiServerStart()
    preload = threading.Thread(target=_preload, daemon=True)
    preload.start()
    env = worker_env(api.url)
    with ray_session(config, env):  # the flow's RLSystem uses this cluster
        startup.mark("ray_connected")
        # done before anything else imports the same packages: transformers' lazy module,
        # imported from two threads at once, can hand one of them a half-initialised name
        preload.join()
        early = early_start.begin(config, system(config, env)) if system is not None else None
        try:
            with api.ready():
                startup.mark("prefect_api")
                freeze_startup_heap()  # the imports, Ray's and Prefect's clients: alive for the run
                state = train(config, return_state=True)
        finally:
            early_start.end(early)
    return 0 if state.is_completed() else 1
