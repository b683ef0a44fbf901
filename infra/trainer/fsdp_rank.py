"""What every FSDP2 rank does the same way, whichever model it trains (the actor's policy or
the critic's value model): join its group's own default process group, hold a sharded
model with its AdamW optimizer and LR schedule, and save or load all of it with DCP.

`TrainerRank` (the actor) and `CriticRank` build on it; each group runs in its own
processes, so each has its own default group and master address. As theirs, this module
imports torch only inside the methods (see infra/trainer/rank.py).
"""

from __future__ import annotations

import os
from contextlib import suppress
from functools import partial
from typing import TYPE_CHECKING, ClassVar

import ray

from infra.cluster.network import advertise_address
from infra.config import RunConfig
from infra.trainer.batch_inbox import BatchInbox, FromManager
from infra.trainer.lr_schedule import lr_factor

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    from torch.optim.lr_scheduler import LambdaLR

    from infra.storage.dcp_io import BackgroundSave


def _trained_only(loading: bool = False) -> StateDictOptions:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # A checkpoint holds what training changes: with a LoRA adapter, the adapter (the frozen
    # base is loaded from model.path again on resume); in full fine-tuning, every parameter.
    # Loading it into the model then leaves the frozen ones out: not strict. A key missing
    # from the checkpoint still fails, in DCP's load into the template of `_dcp_state`.
    return StateDictOptions(ignore_frozen_params=True, strict=not loading)


class FSDPRank:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: LambdaLR
    # Ray concurrency groups (threads beside the main one, which trains): the driver declares
    # them when it wraps the class with `ray.remote` (infra/system.py)
    CONCURRENCY_GROUPS: ClassVar[dict[str, int]] = {"stage": 1}

    def __init__(self, cfg: RunConfig, rank: int, world_size: int) -> None:
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        # a local cluster stays on loopback; on a real cluster peers dial this node's IP
        self._address = advertise_address(local_cluster=not cfg.cluster.ray_address)
        self._writing: BackgroundSave | None = None  # a checkpoint still being written
        self.inbox = BatchInbox()  # rollouts staged ahead of the calls that train on them
        self._store: dist.TCPStore | None = None  # rank 0's rendezvous store, once bound

    @ray.method(concurrency_group="stage")
    def stage_batch(self, rollout_id: int, source: FromManager) -> None:
        """Fetch batch `rollout_id` from `source` while the main thread trains on the
        previous one (infra/trainer/batch_inbox.py); the inbox knows it is on its way first."""
        self.inbox.announce(rollout_id)
        staged = None
        try:
            staged = source.fetch(rollout_id)
        finally:  # a failed stage leaves the batch to be fetched by the call that needs it
            self.inbox.put(rollout_id, staged)

    @ray.method(concurrency_group="stage")  # answers while the rank trains
    def inbox_state(self) -> dict:
        return self.inbox.state()

    def master_address(self) -> tuple[str, int]:
        """Rank 0: where the group meets. The store listens before the port is returned, so
        no other process can take the port before the ranks dial it."""
        from infra.trainer.parallelize import host_store

        if self._store is None:
            self._store = host_store(self._address, self.world_size, self.cfg.cluster.collective_timeout_s)
        return self._address, self._store.port

    def pid(self) -> int:
        return os.getpid()

    def _join(self, master_addr: str, master_port: int) -> None:
        import torch
        import torch.distributed as dist

        from infra.trainer.parallelize import init_distributed

        torch.set_num_threads(self.cfg.cluster.threads_per_worker)
        init_distributed(
            self.rank,
            self.world_size,
            master_addr,
            master_port,
            self.cfg.cluster.collective_timeout_s,
            store=self._store,
        )
        # background checkpoint writes coordinate on their own group: their collectives run
        # while training's run on the default one, and one gloo group must not mix the two
        self._checkpoint_group = dist.new_group(backend="gloo")

    def _optimize(
        self,
        lr: float,
        betas: tuple[float, float],
        weight_decay: float,
        warmup: int,
        kind: str,
        min_ratio: float,
        total: int | None = None,
    ) -> None:
        """AdamW over what trains, and its LR schedule over `total` steps (default: the RL run's)."""
        import torch
        from torch.optim.lr_scheduler import LambdaLR

        # only what trains: with a LoRA adapter the frozen base holds no optimizer state
        trained = [p for p in self.model.parameters() if p.requires_grad]
        # foreach: each update op runs once over all parameters instead of once per parameter.
        # PyTorch picks it by default only for CUDA tensors; on CPU the per-parameter loop pays
        # DTensor's dispatch for every op of every parameter. The updates are the same.
        self.optimizer = torch.optim.AdamW(
            trained, lr=lr, betas=betas, weight_decay=weight_decay, foreach=True
        )
        schedule = partial(
            lr_factor,
            warmup=warmup,
            total=self.cfg.total_optimizer_steps if total is None else total,
            kind=kind,
            min_ratio=min_ratio,
        )
        self.scheduler = LambdaLR(self.optimizer, schedule)

    # --- DCP checkpoints: model, optimizer, scheduler, RNG --------------------------------

    def _dcp_state(self) -> dict:
        import torch
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=_trained_only())
        rng = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state()
        # RNG streams differ per rank: a per-rank key keeps DCP from deduplicating them.
        return {
            "model": model_sd,
            "optim": optim_sd,
            "scheduler": self.scheduler.state_dict(),
            f"rng_rank{self.rank}": rng,
        }

    def save_checkpoint(self, path: str, storage_options: dict, background: bool = False) -> None:
        """Write a DCP checkpoint; with `background`, return once the state is staged and let a
        thread write it (`finish_checkpoint` waits for it). A write still running is finished first."""
        from infra.storage.dcp_io import BackgroundSave, save_state
        from infra.trainer.nonfinite import assert_finite_state

        assert_finite_state(self.model, self.optimizer, self.world_size)
        self.finish_checkpoint()
        if background:
            self._writing = BackgroundSave(self._dcp_state(), path, storage_options, self._checkpoint_group)
        else:
            save_state(self._dcp_state(), path, storage_options)

    def finish_checkpoint(self) -> str | None:
        """Wait for the background write, if any; its path once it is durable, else None."""
        writing, self._writing = self._writing, None
        return writing.wait() if writing is not None else None

    def load_checkpoint(self, path: str, storage_options: dict) -> None:
        import torch
        from torch.distributed.checkpoint.state_dict import set_state_dict

        from infra.storage.dcp_io import load_state

        state = self._dcp_state()  # the template DCP loads into, in place
        load_state(state, path, storage_options)
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=_trained_only(loading=True),
        )
        self.scheduler.load_state_dict(state["scheduler"])
        rng = state[f"rng_rank{self.rank}"]
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng:
            torch.cuda.set_rng_state(rng["cuda"])

    def _leave(self) -> None:
        import torch.distributed as dist

        with suppress(Exception):  # an uncommitted write ends before its group; it stays uncommitted
            self.finish_checkpoint()
        if dist.is_initialized():
            dist.destroy_process_group()
