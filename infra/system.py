"""Bring up every long-lived part of a run on Ray, and take all of it down again.

`RLSystem` is a context manager: whatever happens inside (a failed task, Ctrl-C), the
exit stops the engine servers, kills the actors and removes the placement groups.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

import ray

from infra import startup
from infra.cluster.control_workers import ControlWorkers, close_pool, open_pool
from infra.cluster.placement import PlacementLayout, plan_placement
from infra.cluster.rank_group import RankGroup, get_ranks
from infra.cluster.ray_cluster import (
    bundle_nodes,
    connect,
    create_placement_groups,
    ordered_bundles,
    remove_groups,
    slot_options,
)
from infra.config import RunConfig
from infra.data.rewards import load_callable
from infra.engines.actor import EngineActor
from infra.engines.client import EngineClient
from infra.handles import RunHandles
from infra.model.loading import base_model_uri
from infra.rollout.manager import RolloutManager
from infra.storage.fs import RunStore, storage_options
from infra.tracking import Trackers
from infra.trainer.critic_rank import CriticRank
from infra.trainer.rank import TrainerRank
from infra.weights.transport import WeightTransport, make_transport

log = logging.getLogger(__name__)
# Control workers (infra/cluster/control_workers.py) the loop keeps busy at once: the chain
# train(k) -> sync -> train(k+1) on one, generate(k+1) on the other (save and eval take the one
# that is free); one more with a critic (train-critic(k) beside train(k)).
CONTROL_WORKERS = 2


def actor_class(cls: type) -> ray.actor.ActorClass:
    """`cls` as a Ray actor class, with the concurrency groups it declares: threads of its
    own beside the main one (a trainer rank stages batches and restores engines there)."""
    groups = getattr(cls, "CONCURRENCY_GROUPS", None)
    return ray.remote(concurrency_groups=groups)(cls) if groups else ray.remote(cls)


class RLSystem:
    def __init__(
        self,
        cfg: RunConfig,
        worker_env: Mapping[str, str] | None = None,
        warm_imports: list[str] | None = None,
    ):
        self.cfg = cfg
        self.worker_env = dict(worker_env or {})
        self.warm_imports = warm_imports or []
        self.owns_ray = False
        self.groups: dict = {}
        self.order: dict[str, list[int]] = {}
        self.placement: dict[str, list[str]] = {}
        self.pids: dict[str, list] = {}  # process ids per role (trainer ranks, engine servers)
        self.actors: list = []
        self.engines: list = []
        self.trainers = RankGroup([], "trainer")
        self.critics = RankGroup([], "critic")
        self.transport: WeightTransport | None = None
        self.control: ControlWorkers | None = None
        self.trackers: Trackers | None = None

    def __enter__(self) -> RunHandles:
        try:
            return self.start()
        except BaseException:
            self.dispose()
            raise

    def __exit__(self, *exc) -> None:
        self.dispose()

    def start(self) -> RunHandles:
        cfg = self.cfg
        attached = bool(cfg.rollout.engine_urls)  # engines already running: none placed or launched
        layout = plan_placement(cfg.cluster, critic=cfg.critic.enabled, engines=not attached)
        # False when the command started Ray
        self.owns_ray = connect(cfg.cluster.ray_address, layout, cfg.cluster.num_cpus, self.worker_env)
        startup.mark("ray_connected")
        # the control workers (the flow's task runs) import Prefect while everything else starts
        self.control, warm = open_pool(self.warm_imports, CONTROL_WORKERS + int(cfg.critic.enabled))
        store = RunStore(cfg.storage, cfg.run_name)
        opts = storage_options(cfg.storage)
        model_uri = base_model_uri(cfg.model, store.run_uri, opts)
        log.info("model: %s; run folder: %s", model_uri, store.run_uri)
        self.groups = create_placement_groups(layout)
        self._order_bundles(layout)
        startup.mark("placement_groups")

        # Engines and trainer groups start side by side (separate processes, seconds each);
        # the waits come after, engines first, so a failed engine is still the error raised.
        starting = [] if attached else self._start_engines(layout, model_uri, opts)
        groups = self._place_trainer_groups(layout)
        manager = self._start_manager(model_uri)
        setups = [self._set_up(group, model_uri, opts) for group in groups]
        urls = self._attach_engines() if attached else self._wait_for_engines(starting)
        self._wait_for_trainer_groups(setups)

        self.transport = make_transport(cfg, self.trainers, self.engines, urls, manager)
        self.transport.open()
        startup.mark("transport_open")
        ray.get(manager.attach_engines.remote(urls, list(self.engines), self.transport))
        startup.mark("manager_ready")
        ray.get(warm)
        startup.mark("workers_warm")
        self.trackers = Trackers(cfg, store)
        return RunHandles(
            cfg=cfg,
            trackers=self.trackers,
            manager=manager,
            trainers=self.trainers,
            run_uri=store.run_uri,
            model_uri=model_uri,
            transport=self.transport,
            critics=self.critics,
        )

    def _start_engines(self, layout: PlacementLayout, model_uri: str, opts: dict) -> list[ray.ObjectRef]:
        """Place the engine actors and have them launch their servers; refs to their URLs."""
        cfg, local = self.cfg, not self.cfg.cluster.ray_address
        self.engines = self._place(EngineActor, layout, "engines", lambda i: (cfg, i, local))
        urls = [e.start.remote(model_uri, opts) for e in self.engines]
        if cfg.cluster.colocate:  # sharing devices: an engine sizes its memory before a trainer loads
            ray.wait(urls, num_returns=len(urls))
        return urls

    def _place_trainer_groups(self, layout: PlacementLayout) -> list[RankGroup]:
        """The trainer ranks, and with ppo the critic's; one list of actors per FSDP group."""
        cfg, ranks = self.cfg, self.cfg.cluster.trainer.num_workers
        # cluster.trainer_class: a replacement rank (a stand-in that only waits, in bench/)
        cls = (
            load_callable(cfg.cluster.trainer_class, "cluster.trainer_class")
            if cfg.cluster.trainer_class
            else TrainerRank
        )
        self.trainers = RankGroup(self._place(cls, layout, "trainer", lambda r: (cfg, r, ranks)), "trainer")
        groups = [self.trainers]
        if cfg.critic.enabled:  # ppo: a second FSDP group, its own default process group
            n = cfg.cluster.critic.num_workers
            self.critics = RankGroup(
                self._place(CriticRank, layout, "critic", lambda r: (cfg, r, n)), "critic"
            )
            groups.append(self.critics)
        return groups

    def _start_manager(self, model_uri: str) -> ray.actor.ActorHandle:
        # threaded: the trainers fetch batch k while generation of k+1 runs. Built while the
        # engines and trainer ranks start (its process, imports, tokenizer and prompts take
        # seconds), queued after them, and given the engines once they answer; with the
        # engine actors and the transport it restarts a failed engine and restores its weights.
        manager = (
            ray.remote(RolloutManager).options(num_cpus=0, max_concurrency=8).remote(self.cfg, [], model_uri)
        )
        self.actors.append(manager)
        return manager

    @staticmethod
    def _set_up(group: RankGroup, model_uri: str, opts: dict) -> list[ray.ObjectRef]:
        """Every member of an FSDP group loads the model, meeting at its rank 0's address."""
        addr, port = ray.get(group[0].master_address.remote())
        return group.refs("setup", model_uri, opts, addr, port)

    def _wait_for_engines(self, starting: list[ray.ObjectRef]) -> list[str]:
        urls = ray.get(starting)
        self.pids["engine_servers"] = ray.get([e.pid.remote() for e in self.engines])
        log.info("engines up: %s", urls)
        startup.mark("engines_up")
        return urls

    def _attach_engines(self) -> list[str]:
        """rollout.engine_urls: the servers already running, once each answers /health."""
        urls = list(self.cfg.rollout.engine_urls)
        timeout = self.cfg.rollout.startup_timeout_s

        def wait(url: str) -> None:
            with EngineClient(url) as client:
                client.wait_healthy(timeout)

        with ThreadPoolExecutor(min(32, len(urls))) as pool:
            list(pool.map(wait, urls))
        log.info("attached to %d running engines", len(urls))
        startup.mark("engines_up")
        return urls

    def _wait_for_trainer_groups(self, setups: list[list[ray.ObjectRef]]) -> None:
        get_ranks(setups[0], "setup", "trainer")
        self.pids["trainer_ranks"] = self.trainers.call("pid")
        startup.mark("trainers_ready")
        if self.critics:
            get_ranks(setups[1], "setup", "critic")
            self.pids["critic_ranks"] = self.critics.call("pid")
            startup.mark("critics_ready")

    def _order_bundles(self, layout: PlacementLayout) -> None:
        self.order = {
            name: ordered_bundles(self.groups[name], role.bundles) for name, role in layout.roles.items()
        }
        # the node each process of each role landed on (the flow logs it)
        nodes = {name: bundle_nodes(pg) for name, pg in self.groups.items()}
        self.placement = {
            role: [nodes[s.group][self.order[s.group][s.bundle]] for s in slots]
            for role, slots in layout.slots.items()
        }

    def _place(self, cls: type, layout: PlacementLayout, role: str, args: Callable[[int], tuple]) -> list:
        """One actor per slot of the role (its own bundle, or a trainer bundle when colocated)."""
        remote = actor_class(cls)
        slots = layout.slots[role]
        return [
            remote.options(**slot_options(self.groups, self.order, s)).remote(*args(i))
            for i, s in enumerate(slots)
        ]

    def dispose(self) -> None:
        """Best effort, every step guarded: a failure here must not hide the run's own error."""
        if self.transport is not None:
            try:  # first, while the engines still answer: their group ends cleanly too
                self.transport.close()
            except Exception as e:  # noqa: BLE001
                log.warning("weight transport close failed: %s", e)
            self.transport = None
        if self.trackers is not None:
            try:
                self.trackers.close()
            except Exception as e:  # noqa: BLE001
                log.warning("tracker close failed: %s", e)
            self.trackers = None
        for engine in self.engines:
            try:
                ray.get(engine.stop.remote(), timeout=30)
            except Exception as e:  # noqa: BLE001 - the actor may already be dead
                log.warning("engine stop failed: %s", e)
        for trainer in [*self.trainers, *self.critics]:
            try:  # a rank stuck in a collective with a dead peer never answers: a short wait
                ray.get(trainer.shutdown.remote(), timeout=10)
            except Exception as e:  # noqa: BLE001
                log.warning("trainer shutdown failed: %s", e)
        for actor in [*self.actors, *self.trainers, *self.critics, *self.engines]:
            try:
                ray.kill(actor)
            except Exception as e:  # noqa: BLE001
                log.warning("kill failed: %s", e)
        self.actors, self.engines = [], []
        self.trainers, self.critics = RankGroup([], "trainer"), RankGroup([], "critic")
        if self.control is not None:  # after the flow waited for its task runs' reports
            close_pool(self.control)
            self.control = None
        if self.groups:
            try:
                remove_groups(self.groups)
            except Exception as e:  # noqa: BLE001
                log.warning("placement group removal failed: %s", e)
            self.groups = {}
        if self.owns_ray and ray.is_initialized():
            ray.shutdown()
            self.owns_ray = False
