"""The control tasks' workers never import torch: Ray imports an actor's module wherever a
handle to it is unpickled (every Prefect task run gets the run's handles), so the actor
classes' modules and the task modules must import without it. torch costs each such worker
about 2 CPU-s and 250 MB at its first task run, the first sync's included."""

from __future__ import annotations

import subprocess
import sys
import uuid

import ray

from infra.config import RunConfig

ACTOR_MODULES = [
    "infra.trainer.rank",
    "infra.trainer.critic_rank",
    "infra.rollout.manager",
    "infra.engines.actor",
    "infra.system",
    "infra.stage_systems",
]
TASK_MODULES = [
    "tasks.generate",
    "tasks.train",
    "tasks.train_critic",
    "tasks.sync",
    "tasks.save",
    "tasks.evaluate",
    "tasks.sft",
]


def test_actor_and_task_modules_import_without_torch():
    code = (
        "import importlib, sys\n"
        f"for m in {ACTOR_MODULES + TASK_MODULES!r}: importlib.import_module(m)\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


@ray.remote(num_cpus=0)
def _modules_after_unpickling(handles: list) -> dict:
    # the handles arrived as this task's argument: Ray loaded their classes to unpickle them
    return {m: m in sys.modules for m in ("torch", "infra.trainer.rank", "infra.trainer.critic_rank")}


def test_a_worker_given_rank_handles_does_not_import_torch():
    from infra.system import actor_class
    from infra.trainer.critic_rank import CriticRank
    from infra.trainer.rank import TrainerRank

    ray.init(num_cpus=1, include_dashboard=False, runtime_env={"env_vars": {"TEST_RUN": uuid.uuid4().hex}})
    try:
        cfg = RunConfig()  # the constructors only store it: no setup, no process group
        # as RLSystem builds them (with their concurrency groups)
        actors = [actor_class(cls).options(num_cpus=0).remote(cfg, 0, 2) for cls in (TrainerRank, CriticRank)]
        ray.get([a.pid.remote() for a in actors])  # both alive
        seen = ray.get(_modules_after_unpickling.remote(actors))
        assert seen == {"torch": False, "infra.trainer.rank": True, "infra.trainer.critic_rank": True}
    finally:
        ray.shutdown()


def test_a_control_worker_warmed_imports_nothing_at_its_first_task_run():
    # a task run unpickles the run's handles (Ray imports each actor's class module) and
    # calls its task's module: after the warm imports, none of that is left to import
    code = (
        "import importlib, sys\n"
        "from flows.run_start import WORKER_IMPORTS\n"
        "for m in WORKER_IMPORTS: importlib.import_module(m)\n"
        "before = set(sys.modules)\n"
        f"for m in {ACTOR_MODULES[:4] + TASK_MODULES[:-1]!r}: importlib.import_module(m)\n"
        "print(sorted(set(sys.modules) - before))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
