"""What the Prefect tasks hold: Ray actor handles and a few strings, and one method per
loop step. Each method blocks on the actors and returns a small dict (never tensors)."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

import ray

from infra import startup
from infra.cluster.rank_group import RankGroup, get_ranks
from infra.config import RunConfig
from infra.storage.checkpoints import CheckpointStore, config_hash
from infra.storage.fs import RunStore, storage_options
from infra.storage.metrics import append_metrics, truncate_metrics
from infra.storage.run_folder import resume_point
from infra.tracking import Trackers
from infra.trainer.batch_inbox import FromManager
from infra.weights.transport import WeightTransport

STARTUP_FILE = "startup.json"  # in the run folder: where the start-up time went (see infra.startup)


@dataclass
class RunHandles:
    cfg: RunConfig
    manager: ray.actor.ActorHandle
    trainers: RankGroup
    run_uri: str
    model_uri: str
    transport: WeightTransport
    trackers: Trackers | None = field(default=None, repr=False)
    critics: RankGroup = field(default_factory=lambda: RankGroup([], "critic"))  # ppo's value critic ranks
    # Names the checkpoints this flow run commits: a retried save may return one of its
    # own, never one that an earlier run left under the same iteration number.
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __post_init__(self) -> None:
        # any sequence of actors becomes a group, so every fan-out names a dead rank alike
        if not isinstance(self.trainers, RankGroup):
            self.trainers = RankGroup(self.trainers, "trainer")
        if not isinstance(self.critics, RankGroup):
            self.critics = RankGroup(self.critics, "critic")

    @property
    def store(self) -> RunStore:
        return RunStore(self.cfg.storage, self.cfg.run_name)

    def generate(self, rollout_id: int) -> dict:
        started = time.time()  # on the task's worker: when this generate really began
        summary = ray.get(self.manager.generate.remote(rollout_id))
        self._stage(rollout_id)
        return {**summary, "time_generate_started_unix": started, "time_generate_ended_unix": time.time()}

    def record_startup(self, first_rollout: dict) -> dict[str, float]:
        """Driver side: mark the first generate, write the start-up timeline to the run
        folder (`startup.json`) and return it (phase -> seconds since the process started)."""
        startup.mark("first_generate_started", at=first_rollout["time_generate_started_unix"])
        startup.mark("first_generate_done", at=first_rollout["time_generate_ended_unix"])
        report = {
            "seconds_since_process_start": startup.timeline(),
            "process_start_unix": startup.PROCESS_START_UNIX,
            "marks_unix": startup.marks_unix(),
        }
        self.store.write_text(STARTUP_FILE, json.dumps(report, indent=1))
        return report["seconds_since_process_start"]

    def train(self, rollout_id: int) -> dict:
        # the ranks have the batch staged (see _stage), or fetch it from the manager
        batch = FromManager(self.manager)
        values, mailbox = None, None
        if self.critics:  # ppo: the critic's values arrive through the manager, as Ray resolves the ref
            values = self.manager.wait_post.remote(rollout_id, "values")
            mailbox = self.manager if self.cfg.algorithm.kl_in_reward else None
        results = self.trainers.call("train", rollout_id, batch, values, mailbox, what=f"train {rollout_id}")
        self.manager.release.remote(rollout_id, "actor")
        metrics = dict(results[0])
        # A checkpoint written in the background during this step is committed now. Failing
        # to commit it loses that checkpoint, not the step: the previous one stays the latest.
        # A save writes on every rank (critics too), so with none writing there is nothing to
        # wait for: the round trip to every rank is left out of the other iterations.
        if any(r.get("checkpoint_writing") for r in results):
            try:
                metrics["checkpoint_committed"] = self.commit_pending()
            except Exception as exc:  # noqa: BLE001 - reported by the train task as a warning
                metrics["checkpoint_commit_error"] = f"{type(exc).__name__}: {exc}"
        metrics.pop("checkpoint_writing", None)
        return metrics

    def train_critic(self, rollout_id: int) -> dict:
        """ppo: the critic's values of batch k (posted for the actor), then its value-loss steps.

        Runs beside `train`: the actor waits only for the values; the critic waits for the
        actor's per-token KL only when the KL is in the reward and the actor trains this
        iteration (in critic-only iterations the actor is still the reference: KL 0).
        """
        t0 = time.monotonic()
        batch = FromManager(self.manager)
        refs = self.critics.refs("compute_values", rollout_id, batch)
        posted = self.manager.post.remote(rollout_id, "values", refs[0])  # critic rank 0 -> manager
        get_ranks(refs, f"critic values {rollout_id}", self.critics.role)
        kl = None
        if self.cfg.algorithm.kl_in_reward and rollout_id >= self.cfg.num_critic_only_steps:
            kl = self.manager.wait_post.remote(rollout_id, "kl")
        results = self.critics.call("train", rollout_id, batch, kl, what=f"critic {rollout_id}")
        ray.get(posted)
        self.manager.release.remote(rollout_id, "critic")
        return {**results[0], "time_train_critic_s": time.monotonic() - t0}

    def _stage(self, rollout_id: int) -> None:
        """Have every rank fetch batch `rollout_id` now, in a thread beside training, so the
        train call that follows the weight sync finds it ready (infra/trainer/batch_inbox.py).
        Not waited for: a rank without it fetches it in the train call."""
        source = FromManager(self.manager)
        self.trainers.refs("stage_batch", rollout_id, source)
        self.critics.refs("stage_batch", rollout_id, source)

    def release_engines(self) -> dict:
        """Colocated mode: engines free their weights so the trainer has the devices to itself."""
        t0 = time.monotonic()
        ray.get(self.manager.set_engine_memory.remote(resident=False))
        return {"time_engine_release_s": time.monotonic() - t0}

    def resume_engines(self) -> dict:
        """Colocated mode: engines take their memory back (before the weight sync refills it)."""
        t0 = time.monotonic()
        ray.get(self.manager.set_engine_memory.remote(resident=True))
        return {"time_engine_resume_s": time.monotonic() - t0}

    def sync(self, weight_version: int) -> dict:
        t0 = time.monotonic()
        # an engine that died since the last generate is restarted and restored first
        restarts = ray.get(self.manager.ensure_engines.remote())
        result = self.transport.push(weight_version)
        if self.cfg.weight_sync.check_weight_update_equal:
            checks = self.trainers.call("check_weights_equal", what="weight check")
            result.update(checks[0])
        result["time_sync_s"] = time.monotonic() - t0
        result["engine_weight_version"] = weight_version
        result["sync_engine_restarts"] = restarts
        return result

    def evaluate(self, rollout_id: int) -> dict:
        return ray.get(self.manager.evaluate.remote(rollout_id))

    def save(self, rollout_id: int, export_hf: bool, background: bool = False) -> dict:
        """Checkpoint after iteration `rollout_id`: shards, prompt state, then the commit marker.

        A batch already generated ahead (async mode) is persisted as its rollout parquet;
        the checkpoint names it, and a resume trains on it instead of regenerating with
        newer weights, which keeps async resume exact.

        With `background`, the ranks return once their state is staged and write it while
        training goes on; the marker follows when the writes are durable (`commit_pending`,
        called by the next train or save). A previous background save is committed first.
        """
        t0 = time.monotonic()
        ckpts = self._checkpoints()
        self.commit_pending(ckpts)
        if ckpts.is_committed(rollout_id):
            if ckpts.meta(rollout_id).get("run_id") == self.run_id:
                # a retried save whose first attempt committed: the checkpoint is whole
                return {"checkpoint_uri": ckpts.uri(rollout_id), "time_save_s": 0.0}
            ckpts.discard(rollout_id)  # an earlier run's (resumed from before it): replace it
        path = ckpts.begin(rollout_id)
        opts = storage_options(self.cfg.storage)
        nxt = rollout_id + 1
        meta = {
            "rollout_id": rollout_id,
            "next_rollout_id": nxt,
            "weight_version": nxt,
            "prefetched_rollout": nxt if ray.get(self.manager.has_batch.remote(nxt)) else None,
            "prompt_source": ray.get(self.manager.prompt_state.remote(nxt)),
            "config_hash": config_hash(self.cfg),
            "run_id": self.run_id,
        }
        ckpts.mark_pending(rollout_id, meta)
        model_uri = ckpts.model_uri(path)
        self.trainers.call("save_checkpoint", model_uri, opts, background, what="save")
        self._save_critic(path, opts, background)  # before the commit marker, like the actor's shards
        result = {"checkpoint_uri": ckpts.uri(rollout_id), "checkpoint_committed": not background}
        if not background:
            ckpts.commit(rollout_id, meta)
        if export_hf:
            result["hf_export_uri"] = self.store.uri("hf", "latest")
            self.trainers.call("export_hf", result["hf_export_uri"], opts, what="export")
        result["time_save_s"] = time.monotonic() - t0
        return result

    def commit_pending(self, ckpts: CheckpointStore | None = None) -> int | None:
        """Wait for the ranks' background checkpoint write, then commit it; returns its iteration.

        Every rank of every trainer group must report its write durable before the marker is
        written. A failed write leaves the folder uncommitted (the next save cleans it) and
        raises, so a resume can never load it."""
        ckpts = ckpts or self._checkpoints()
        # every rank that writes into a checkpoint (critics too) must be durable first
        written = [
            *self.trainers.call("finish_checkpoint", what="checkpoint write"),
            *self.critics.call("finish_checkpoint", what="critic checkpoint write"),
        ]
        return ckpts.commit_written(self.run_id, written)

    def _checkpoints(self) -> CheckpointStore:
        return CheckpointStore(self.store, keep_last=self.cfg.checkpoint.keep_last)

    def restore(self) -> int:
        """Load the checkpoint `checkpoint.resume` points at; returns the next rollout id.

        Metrics rows from that id on are dropped, also when there is no checkpoint to load
        (`auto` on a run that stopped before its first save): those iterations run again.
        """
        point = resume_point(self.cfg, self.store)
        nxt = 0
        if point is not None:
            uri, meta = point
            opts = storage_options(self.cfg.storage)
            self.trainers.call("load_checkpoint", f"{uri}/model", opts, what="load")
            self._restore_critic(uri, opts)
            nxt = meta["next_rollout_id"]
            prefetched = meta.get("prefetched_rollout")
            ray.get(self.manager.restore.remote(meta["prompt_source"], prefetched, nxt - 1))
        truncate_metrics(self.store, nxt)  # rows of iterations that will be redone
        return nxt

    def _save_critic(self, ckpt_uri: str, opts: dict, background: bool) -> None:
        """The critic's DCP state (model, optimizer, scheduler) in `critic/` beside `model/`."""
        if self.critics:
            uri = f"{ckpt_uri.rstrip('/')}/critic"
            self.critics.call("save_checkpoint", uri, opts, background, what="critic save")

    def _restore_critic(self, ckpt_uri: str, opts: dict) -> None:
        if self.critics:
            uri = f"{ckpt_uri.rstrip('/')}/critic"
            self.critics.call("load_checkpoint", uri, opts, what="critic load")

    def record(self, row: dict) -> None:
        append_metrics(self.store, row)
        if self.trackers is not None:
            self.trackers.log(row)

    def outputs(self) -> dict:
        ckpts = self._checkpoints()
        latest = ckpts.latest()
        return {
            "checkpoint": ckpts.uri(latest) if latest is not None else "",
            "rollouts": self.store.uri("rollouts"),
            "metrics": self.store.uri("metrics.jsonl"),
        }
