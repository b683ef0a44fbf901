"""One FSDP2 trainer rank. A plain class: the driver wraps it with `ray.remote(TrainerRank)`."""

from __future__ import annotations

import json
import os
import time
from contextlib import nullcontext, suppress
from functools import partial

import ray
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR

from infra.cluster.network import advertise_address, free_port
from infra.config import RunConfig
from infra.model.loading import localize
from infra.rollout.batch import RolloutBatch
from infra.storage.dcp_io import BackgroundSave, load_state, save_state
from infra.storage.fs import upload_dir
from infra.trainer.guard import assert_finite_state
from infra.trainer.lr_schedule import lr_factor
from infra.trainer.parallelize import init_distributed, parallelize
from infra.trainer.step import train_on_batch
from infra.weights.broadcast import BroadcastSender
from infra.weights.buckets import bucket_params
from infra.weights.check import WeightCheck
from infra.weights.engines import EngineLink, connect_engines
from infra.weights.group import close_update_group


def _full(param: torch.Tensor) -> torch.Tensor:
    # A collective on the default group for FSDP2's DTensors: every rank must call it.
    return param.full_tensor() if isinstance(param, DTensor) else param


class TrainerRank:
    def __init__(self, cfg: RunConfig, rank: int, world_size: int) -> None:
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self._links: list[EngineLink] = []
        self._sender: BroadcastSender | None = None
        # rank 0: the buckets of the last complete push, as sent (engine dtype), and their
        # version; a restarted engine gets them while the ranks train (no collective needed)
        self._last_push: tuple[str, list[tuple[list[str], list[torch.Tensor]]]] | None = None
        # a local cluster stays on loopback; on a real cluster peers dial this node's IP
        self._address = advertise_address(local_cluster=not cfg.cluster.ray_address)
        self._writing: BackgroundSave | None = None  # a checkpoint still being written

    def master_address(self) -> tuple[str, int]:
        return self._address, free_port(self._address)

    def setup(self, model_uri: str, storage_options: dict, master_addr: str, master_port: int) -> None:
        """Join the trainer group and load the model (from a local or s3:// HF directory)."""
        model_path = self.model_dir = localize(model_uri, storage_options)
        torch.set_num_threads(self.cfg.cluster.threads_per_worker)
        init_distributed(
            self.rank, self.world_size, master_addr, master_port, self.cfg.cluster.collective_timeout_s
        )
        # background checkpoint writes coordinate on their own group: their collectives run
        # while training's run on the default one, and one gloo group must not mix the two
        self._checkpoint_group = dist.new_group(backend="gloo")
        alg = self.cfg.algorithm
        torch.manual_seed(alg.seed)
        self.model = self._load(model_path, trainable=True)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=alg.lr, betas=alg.betas, weight_decay=alg.weight_decay
        )
        schedule = partial(
            lr_factor,
            warmup=alg.warmup_steps,
            total=self.cfg.total_optimizer_steps,
            kind=alg.lr_schedule,
            min_ratio=alg.min_lr_ratio,
        )
        self.scheduler = LambdaLR(self.optimizer, schedule)
        self.ref_model = self._load(model_path, trainable=False) if alg.kl_coef > 0 else None

    def _load(self, model_path: str, trainable: bool) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        # fp32 master weights; on GPUs FSDP's mixed precision computes in bf16.
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        model.requires_grad_(trainable)
        model.train(trainable)
        return parallelize(model, self.world_size)

    def train(self, rollout_id: int, batch: RolloutBatch) -> dict:
        start = time.perf_counter()
        metrics = train_on_batch(
            self.model,
            self.optimizer,
            self.scheduler,
            batch.samples,
            rank=self.rank,
            world_size=self.world_size,
            cfg=self.cfg.algorithm,
            # default: the whole rollout as it arrived, even if the manager dropped samples
            global_batch_size=self.cfg.algorithm.global_batch_size or len(batch),
            temperature=self.cfg.rollout.sampling.temperature,
            ref_model=self.ref_model,
            tis=self.cfg.tis_enabled,
            max_response_len=self.cfg.rollout.sampling.max_new_tokens,
            rollout_id=rollout_id,  # = the trainer's weight version: iterations trained so far
        )
        return {**metrics, "rollout_id": rollout_id, "time_train_s": time.perf_counter() - start}

    # --- weight sync: the rank-side half of infra/weights (gathers are collective) -------

    @ray.method(concurrency_group="restore")  # also after an engine restart, beside training
    def connect_engines(self, engine_urls: list[str]) -> None:
        """Rank 0 learns the engines' dtype and group ranks (the check needs them in any mode)."""
        if self.rank != 0:
            return
        with open(os.path.join(self.model_dir, "config.json")) as f:
            model_config = json.load(f)  # the checkpoint's dtype, not the fp32 we train in
        self._links = connect_engines(
            engine_urls, self.cfg.rollout.tp_size, model_config, self.cfg.weight_sync.timeout_s
        )

    def open_weight_group(self, group_name: str) -> None:
        if self.rank != 0:
            return
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        self._sender = BroadcastSender(self._links, group_name, self.cfg.weight_sync.timeout_s)
        self._sender.open(self._address, free_port(self._address), backend)

    @ray.method(concurrency_group="restore")
    def restore_engines(self, engine_urls: list[str], group_name: str) -> str:
        """Rank 0, beside a running train step: rebuild the weight-update group over the
        engines' current URLs (one restarted) under a fresh name, and send every engine the
        weights of the last push with their version; returns that version.

        Only this rank's copy of the last push is used, so no collective of the trainer
        group is needed. The engines that stayed up receive the weights they already hold.
        """
        if self.rank != 0 or self._last_push is None:
            raise RuntimeError("restore_engines: rank 0 has no pushed weights to restore from")
        old, self._sender = self._sender, None
        if old is not None:
            with suppress(RuntimeError):  # live engines destroy their end; the dead one cannot
                old.close()
        self.connect_engines(engine_urls)
        self.open_weight_group(group_name)
        version, buckets = self._last_push
        with torch.no_grad(), self._sender.session():
            for i, (names, tensors) in enumerate(buckets):
                self._sender.send_bucket(names, tensors, i == len(buckets) - 1, version)
        return version

    def pid(self) -> int:
        return os.getpid()

    @ray.method(concurrency_group="restore")  # also while the main thread is stuck
    def close_weight_group(self) -> None:
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.close()

    def update_weights(self, weight_version: int) -> dict:
        """Push all parameters to the engines; every rank must call it (gathers are collective)."""
        if self.rank == 0 and self._sender is None:
            raise RuntimeError("update_weights before open_weight_group")
        start, nbytes = time.perf_counter(), 0
        params = dict(self.model.named_parameters())
        sizes = [(name, p.numel() * p.element_size()) for name, p in params.items()]
        buckets = bucket_params(sizes, int(self.cfg.weight_sync.bucket_size_mb * 2**20))
        session = self._sender.session() if self.rank == 0 else nullcontext()
        keep = self.rank == 0 and self.cfg.rollout.engine_max_restarts > 0
        kept: list[tuple[list[str], list[torch.Tensor]]] = []
        failed: Exception | None = None
        with torch.no_grad(), session:
            for i, names in enumerate(buckets):
                tensors = [_full(params[name]) for name in names]
                if self.rank == 0 and failed is None:
                    last = i == len(buckets) - 1
                    try:
                        nbytes += self._sender.send_bucket(names, tensors, last, str(weight_version))
                    except Exception as exc:  # noqa: BLE001 - raised below, after the gathers
                        failed = exc  # the other ranks still gather every bucket: keep in step
                    if keep:
                        kept.append((names, [t.detach().to(self._sender.dtype, copy=True) for t in tensors]))
        if failed is not None:
            raise failed
        if keep:
            self._last_push = (str(weight_version), kept)
        return {"time_sync_s": time.perf_counter() - start, "num_buckets": len(buckets), "bytes": nbytes}

    def check_weights_equal(self) -> dict:
        """Compare every parameter, in the engines' dtype, with what each engine reports
        (all ranks gather; rank 0 compares and raises WeightMismatchError naming the first
        tensor and engine that differ)."""
        check = WeightCheck(self._links) if self.rank == 0 else None
        failed: Exception | None = None
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                full = _full(param)  # every rank gathers, whatever rank 0 finds
                if check is not None and failed is None:
                    try:
                        check.compare(name, full)
                    except Exception as exc:  # noqa: BLE001 - raised below, after the gathers
                        failed = exc  # an engine that does not answer: keep the ranks in step
        if failed is not None:
            raise failed
        return check.raise_on_mismatch() if check is not None else {}

    # --- state: full dict, DCP checkpoints, HF export -------------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Unsharded CPU state dict on rank 0 ({} elsewhere); every rank must call it."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.model, options=options)

    def _dcp_state(self) -> dict:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
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
        state = self._dcp_state()  # the template DCP loads into, in place
        load_state(state, path, storage_options)
        set_state_dict(
            self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        self.scheduler.load_state_dict(state["scheduler"])
        rng = state[f"rng_rank{self.rank}"]
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng:
            torch.cuda.set_rng_state(rng["cuda"])

    def export_hf(self, uri: str, storage_options: dict) -> None:
        """Write an HF model directory (safetensors, config, tokenizer) to a local or s3:// URI.

        Every rank must call it (the weights are gathered); rank 0 writes. Remote targets
        are written to a temporary folder first and uploaded, config.json last, so a reader
        that waits for config.json never sees a half-written export.
        """
        state = self.full_state_dict()
        if self.rank != 0:
            return
        import tempfile

        from transformers import AutoModelForCausalLM, AutoTokenizer

        with torch.device("meta"):
            plain = AutoModelForCausalLM.from_config(self.model.config)
        plain.load_state_dict(state, assign=True)
        with tempfile.TemporaryDirectory() as tmp:
            plain.save_pretrained(tmp)
            AutoTokenizer.from_pretrained(self.model_dir).save_pretrained(tmp)
            upload_dir(tmp, uri, storage_options, self.cfg.storage.retry_timeout_s)

    def shutdown(self) -> None:
        with suppress(Exception):  # an uncommitted write ends before its group; it stays uncommitted
            self.finish_checkpoint()
        if self._sender is not None and self._sender.group is not None:
            close_update_group(self._sender.group)  # the engines may be gone: only our end
            self._sender = None
        if dist.is_initialized():
            dist.destroy_process_group()
