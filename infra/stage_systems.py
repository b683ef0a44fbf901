"""The actors of the pipeline's stages other than RL (flows/pipeline.py).

`SFTSystem` starts the trainer ranks alone (the same FSDP2 `TrainerRank` actors RL uses,
placed the same way); `EvalSystem` starts the rollout engines and the rollout manager alone.
Both are an `RLSystem` with fewer parts, so their exit disposes of them the same way.
"""

from __future__ import annotations

import ray

from infra import startup
from infra.cluster.control_workers import open_pool
from infra.cluster.placement import PlacementLayout, plan_placement
from infra.cluster.rank_group import RankGroup, get_ranks
from infra.cluster.ray_cluster import connect, create_placement_groups
from infra.model.loading import base_model_uri
from infra.stage_handles import EvalHandles, SFTHandles
from infra.storage.fs import RunStore, storage_options
from infra.system import RLSystem
from infra.trainer.rank import TrainerRank


def only(layout: PlacementLayout, role: str) -> PlacementLayout:
    """The placement of one role: its processes and the groups they sit in (colocated
    engines sit in the trainer's group)."""
    slots = layout.slots[role]
    return PlacementLayout({s.group: layout.roles[s.group] for s in slots}, {role: slots})


class _StageSystem(RLSystem):
    def _connect(self, role: str) -> tuple[PlacementLayout, str, dict]:
        """Ray, the control workers (one) and the role's placement groups; the layout, the
        model's URI and the storage options."""
        cfg = self.cfg
        layout = only(plan_placement(cfg.cluster), role)
        self.owns_ray = connect(cfg.cluster.ray_address, layout, cfg.cluster.num_cpus, self.worker_env)
        self.control, self._warm = open_pool(self.warm_imports, 1)
        opts = storage_options(cfg.storage)
        model_uri = base_model_uri(cfg.model, RunStore(cfg.storage, cfg.run_name).run_uri, opts)
        self.groups = create_placement_groups(layout)
        self._order_bundles(layout)
        return layout, model_uri, opts


class SFTSystem(_StageSystem):
    def start(self) -> SFTHandles:  # type: ignore[override] - the stage's own handles
        cfg, ranks = self.cfg, self.cfg.cluster.trainer.num_workers
        layout, model_uri, opts = self._connect("trainer")
        self.trainers = RankGroup(
            self._place(TrainerRank, layout, "trainer", lambda r: (cfg, r, ranks)), "trainer"
        )
        addr, port = ray.get(self.trainers[0].master_address.remote())
        plans = get_ranks(self.trainers.refs("setup_sft", model_uri, opts, addr, port), "sft setup")
        self.pids["trainer_ranks"] = self.trainers.call("pid")
        startup.mark("trainers_ready")
        ray.get(self._warm)
        return SFTHandles(cfg, self.trainers, model_uri, plans[0])


class EvalSystem(_StageSystem):
    def start(self) -> EvalHandles:  # type: ignore[override] - the stage's own handles
        layout, model_uri, opts = self._connect("engines")
        starting = self._start_engines(layout, model_uri, opts)
        manager = self._start_manager(model_uri)
        urls = self._wait_for_engines(starting)
        # no weight transport: a restarted engine loads model_uri, the weights it served
        ray.get(manager.attach_engines.remote(urls, list(self.engines)))
        ray.get(self._warm)
        return EvalHandles(self.cfg, manager, model_uri)
