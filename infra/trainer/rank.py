"""One FSDP2 trainer rank. A plain class: the driver wraps it with `ray.remote(TrainerRank)`.

Ray imports this module wherever a handle to the actor is unpickled, in every Prefect task
run's worker too; torch and everything built on it are imported inside the methods, which
run only in the rank's own process (tests/unit/test_actor_imports.py).
"""

from __future__ import annotations

import json
import os
import time
from contextlib import nullcontext, suppress
from typing import TYPE_CHECKING, ClassVar

import ray

from infra.config import RunConfig
from infra.heap import freeze_startup_heap
from infra.model.loading import localize
from infra.rollout.batch import RolloutBatch
from infra.storage.fs import upload_dir
from infra.trainer.batch_inbox import FromManager
from infra.trainer.fsdp_rank import FSDPRank

if TYPE_CHECKING:
    import torch

    from infra.trainer.push import SentBucket
    from infra.weights.broadcast import BroadcastSender
    from infra.weights.engines import EngineLink


def _full(param: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    # A collective on the default group for FSDP2's DTensors: every rank must call it.
    return param.full_tensor() if isinstance(param, DTensor) else param


def _save_model(state: dict[str, torch.Tensor], config, directory: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(state, assign=True)
    plain.save_pretrained(directory)


class TrainerRank(FSDPRank):
    # "restore": an engine restarted mid-run gets its weights from a thread beside training
    CONCURRENCY_GROUPS: ClassVar[dict[str, int]] = {**FSDPRank.CONCURRENCY_GROUPS, "restore": 1}

    def __init__(self, cfg: RunConfig, rank: int, world_size: int) -> None:
        super().__init__(cfg, rank, world_size)
        self._links: list[EngineLink] = []
        self._sender: BroadcastSender | None = None
        # rank 0: the buckets of the last complete push, as sent (names, shapes, payload in
        # the engines' dtype), and their version; a restarted engine gets them while the
        # ranks train (no collective needed)
        self._last_push: tuple[str, list[SentBucket]] | None = None
        # rank 0, CPU payloads only: per bucket, a payload no one holds any more, filled again
        # by the next push. A fresh CPU buffer costs a page fault per 4 KiB page as it is
        # first written (9 ms for 36 MiB, measured: most of a gather's time); the GPU's
        # caching allocator hands back its blocks anyway, and GPU memory is dearer.
        self._spare: list[list[torch.Tensor]] = []

    def setup(self, model_uri: str, storage_options: dict, master_addr: str, master_port: int) -> None:
        """Join the trainer group and load the model (from a local or s3:// HF directory)."""
        import torch

        model_path = self.model_dir = localize(model_uri, storage_options)
        self._join(master_addr, master_port)
        alg = self.cfg.algorithm
        torch.manual_seed(alg.seed)
        self.model = self._load(model_path, trainable=True)
        self._optimize(
            alg.lr, alg.betas, alg.weight_decay, alg.warmup_steps, alg.lr_schedule, alg.min_lr_ratio
        )
        self.ref_model = self._load(model_path, trainable=False) if alg.kl_coef > 0 else None
        freeze_startup_heap()

    def _load(self, model_path: str, trainable: bool) -> torch.nn.Module:
        import torch
        from transformers import AutoModelForCausalLM

        from infra.trainer.parallelize import parallelize

        # fp32 master weights; on GPUs FSDP's mixed precision computes in bf16.
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        model.requires_grad_(trainable)
        if trainable and self.cfg.model.lora is not None:
            from infra.model.lora import apply_lora

            model = apply_lora(model, self.cfg.model.lora)  # the base frozen, the adapter trained
        model.train(trainable)
        return parallelize(model, self.world_size, self.cfg.cluster.fsdp_gather)

    def train(
        self,
        rollout_id: int,
        batch: RolloutBatch | FromManager,
        values: list[list[float]] | None = None,
        mailbox: ray.actor.ActorHandle | None = None,
    ) -> dict:
        """One training call on `batch`, or on the batch staged for `rollout_id` (fetched
        from the manager if none was). ppo: `values` are the critic's; with `mailbox` (the
        rollout manager), rank 0 posts the per-token KL there for the critic's returns."""
        from infra.trainer.step import train_on_batch

        received = time.perf_counter()
        batch = self.inbox.take(rollout_id, batch)  # before the clock: receiving is not training
        start = time.perf_counter()
        publish_kl = None
        if mailbox is not None and self.rank == 0:

            def publish_kl(kl: list[list[float]]) -> None:
                ray.get(mailbox.post.remote(rollout_id, "kl", kl))

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
            values=values,
            publish_kl=publish_kl,
        )
        return {
            **metrics,
            "rollout_id": rollout_id,
            "time_train_s": time.perf_counter() - start,
            # ~0 when the batch was staged in time; else the wait for it or its fetch
            "time_batch_wait_s": start - received,
            # a background checkpoint write awaits its commit (RunHandles.train asks only then)
            "checkpoint_writing": self._writing is not None,
        }

    # --- supervised warm start (infra/trainer/sft.py) -------------------------------------

    def setup_sft(self, model_uri: str, storage_options: dict, master_addr: str, master_port: int) -> dict:
        """Join the trainer group, load the model, the labelled examples (tokenized here, the
        same on every rank) and an optimizer with the `sft` section's settings."""
        import torch

        from infra.data.labelled import sft_rows, tokenize_examples
        from infra.model.tokenizer import load_tokenizer
        from infra.trainer.sft import steps_per_epoch

        self.model_dir = localize(model_uri, storage_options)
        self._join(master_addr, master_port)
        sft = self.cfg.sft
        torch.manual_seed(sft.seed)
        self.model = self._load(self.model_dir, trainable=True)
        rows, evaluated = sft_rows(self.cfg, storage_options)
        self._examples, dropped = tokenize_examples(self.cfg, rows, load_tokenizer(self.model_dir))
        steps = steps_per_epoch(len(self._examples), sft.batch_size)
        self._optimize(
            sft.lr, sft.betas, sft.weight_decay, sft.warmup_steps, sft.lr_schedule, sft.min_lr_ratio,
            total=sft.epochs * steps,
        )  # fmt: skip
        self.ref_model = None
        freeze_startup_heap()
        return {
            "examples": len(self._examples),
            "dropped": dropped,
            "eval_prompts_left_out": evaluated,
            "steps_per_epoch": steps,
        }

    def sft_epoch(self, epoch: int) -> dict:
        """One epoch of SFT steps (every rank must call it: the steps are collective)."""
        from infra.trainer.sft import train_sft_epoch

        start = time.perf_counter()
        metrics = train_sft_epoch(
            self.model, self.optimizer, self.scheduler, self._examples, epoch,
            rank=self.rank, world_size=self.world_size, cfg=self.cfg.sft,
        )  # fmt: skip
        return {**metrics, "epoch": epoch, "time_sft_epoch_s": time.perf_counter() - start}

    # --- weight sync: the rank-side half of infra/weights (gathers are collective) -------

    @ray.method(concurrency_group="restore")  # also after an engine restart, beside training
    def connect_engines(self, engine_urls: list[str]) -> None:
        """Rank 0 learns the engines' dtype and group ranks (the check needs them in any mode)."""
        from infra.weights.engines import connect_engines

        if self.rank != 0:
            return
        with open(os.path.join(self.model_dir, "config.json")) as f:
            model_config = json.load(f)  # the checkpoint's dtype, not the fp32 we train in
        self._links = connect_engines(
            engine_urls, self.cfg.rollout.tp_size, model_config, self.cfg.weight_sync.timeout_s
        )

    def open_weight_group(self, group_name: str) -> None:
        import torch

        from infra.weights.broadcast import BroadcastSender

        if self.rank != 0:
            return
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        sync = self.cfg.weight_sync
        self._sender = BroadcastSender(self._links, group_name, sync.timeout_s, sync.flattened_buckets)
        # port 0: the OS picks one, and the sender binds it before the engines hear of it
        self._sender.open(self._address, 0, backend)

    @ray.method(concurrency_group="restore")
    def restore_engines(self, engine_urls: list[str], group_name: str) -> str:
        """Rank 0, beside a running train step: rebuild the weight-update group over the
        engines' current URLs (one restarted) under a fresh name, and send every engine the
        weights of the last push with their version; returns that version.

        Only this rank's copy of the last push is used, so no collective of the trainer
        group is needed. The engines that stayed up receive the weights they already hold.
        """
        import torch

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
            for i, (names, shapes, payload) in enumerate(buckets):
                pending = self._sender.announce(names, shapes, i == len(buckets) - 1, version)
                self._sender.transmit(pending, payload)
        return version

    @ray.method(concurrency_group="restore")  # also while the main thread is stuck
    def close_weight_group(self) -> None:
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.close()

    def update_weights(self, weight_version: int) -> dict:
        """Push all parameters to the engines; every rank must call it (gathers are collective).

        Per bucket, rank 0 announces it to the engines first (the HTTP request runs in the
        background), then one gather brings every rank's shards straight into rank 0's
        payload (in the engines' dtype), then rank 0 broadcasts it while the next bucket is
        gathered (infra/trainer/push.py)."""
        import torch

        from infra.trainer.lora_merge import merged_params
        from infra.trainer.push import push_buckets
        from infra.weights.buckets import bucket_params

        if self.rank == 0 and self._sender is None:
            raise RuntimeError("update_weights before open_weight_group")
        start = time.perf_counter()
        sender = self._sender if self.rank == 0 else None
        keep = sender is not None and self.cfg.rollout.engine_max_restarts > 0
        reuse = self._spare if sender is not None and sender.device.type == "cpu" else None
        with merged_params(self.model) as params:
            sizes = [(name, p.numel() * p.element_size()) for name, p in params.items()]
            buckets = bucket_params(sizes, int(self.cfg.weight_sync.bucket_size_mb * 2**20))
            with torch.no_grad(), sender.session() if sender is not None else nullcontext():
                pushed = push_buckets(params, buckets, sender, str(weight_version), keep, reuse)
        if pushed.failed is not None:
            raise pushed.failed
        if reuse is not None:  # what the kept push no longer holds (see _spare)
            old = self._last_push[1] if keep and self._last_push is not None else []
            self._spare = [payload for _, _, payload in old] if keep else pushed.payloads
        if keep:
            self._last_push = (str(weight_version), pushed.sent)
        stats = {
            "time_sync_s": time.perf_counter() - start,
            "num_buckets": len(buckets),
            "bytes": pushed.nbytes,
        }
        # phase times: this rank's gathers, and rank 0's sender (see BroadcastSender.timings)
        timings = {"gather_s": pushed.gather_s, **(sender.take_timings() if sender is not None else {})}
        stats.update({f"time_sync_{k}": v for k, v in timings.items()})
        return stats

    def check_weights_equal(self) -> dict:
        """Compare every parameter, in the engines' dtype, with what each engine reports
        (all ranks gather; rank 0 compares and raises WeightMismatchError naming the first
        tensor and engine that differ)."""
        import torch

        from infra.trainer.lora_merge import merged_params
        from infra.weights.check import WeightCheck

        check = WeightCheck(self._links) if self.rank == 0 else None
        failed: Exception | None = None
        # an engine given only the adapter holds the frozen base, and applies the adapter itself
        merge = self.cfg.weight_sync.lora == "merged"
        with torch.no_grad(), merged_params(self.model, merge) as params:
            for name, param in params.items():
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
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.model, options=options)

    def export_hf(self, uri: str, storage_options: dict, merged: bool = False) -> None:
        """Write an HF model directory (safetensors, config, tokenizer) to a local or s3:// URI.
        With `model.lora`, a PEFT adapter directory (adapter_config.json,
        adapter_model.safetensors, the tokenizer), or with `merged` the base model with the
        adapter merged in.

        Every rank must call it (the weights are gathered); rank 0 writes. Remote targets
        are written to a temporary folder first and uploaded, config.json last, so a reader
        that waits for config.json never sees a half-written export.
        """
        state = self.full_state_dict()
        if self.rank != 0:
            return
        import tempfile

        from transformers import AutoTokenizer

        from infra.model.lora import merged_state_dict, save_adapter

        lora = self.cfg.model.lora is not None
        with tempfile.TemporaryDirectory() as tmp:
            if lora and not merged:
                save_adapter(state, self.model, tmp)
            else:
                _save_model(merged_state_dict(state, self.model) if lora else state, self.model.config, tmp)
            AutoTokenizer.from_pretrained(self.model_dir).save_pretrained(tmp)
            upload_dir(tmp, uri, storage_options, self.cfg.storage.retry_timeout_s)

    def shutdown(self) -> None:
        from infra.weights.group import close_update_group

        if self._sender is not None and self._sender.group is not None:
            close_update_group(self._sender.group)  # the engines may be gone: only our end
            self._sender = None
        self._leave()
