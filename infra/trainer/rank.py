"""One FSDP2 trainer rank. A plain class: the driver wraps it with `ray.remote(TrainerRank)`."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

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
from infra.rollout.client import EngineClient
from infra.storage.dcp_io import load_state, save_state
from infra.storage.fs import upload_dir
from infra.trainer.parallelize import init_distributed, parallelize
from infra.trainer.step import train_on_batch
from infra.weights.buckets import bucket_params, dtype_name
from infra.weights.group import broadcast, open_update_group


class WeightMismatchError(RuntimeError):
    """An engine holds a tensor that differs from the trainer's after a weight sync."""


def broadcast_bucket(group: dist.ProcessGroup, tensors: list[torch.Tensor]) -> None:
    """Send a bucket from rank 0 of the update group, one broadcast per tensor, in order.

    The order is the contract: the engine receives into buffers it allocated from the
    `names/dtypes/shapes` of the matching update_weights_from_distributed request.
    """
    for tensor in tensors:
        broadcast(group, tensor, src=0)


def _full(param: torch.Tensor) -> torch.Tensor:
    # A collective on the default group for FSDP2's DTensors: every rank must call it.
    return param.full_tensor() if isinstance(param, DTensor) else param


class TrainerRank:
    def __init__(self, cfg: RunConfig, rank: int, world_size: int) -> None:
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self._group: dist.ProcessGroup | None = None
        self._clients: list[EngineClient] = []
        # a local cluster stays on loopback; on a real cluster peers dial this node's IP
        self._address = advertise_address(local_cluster=not cfg.cluster.ray_address)

    def master_address(self) -> tuple[str, int]:
        return self._address, free_port(self._address)

    def setup(self, model_uri: str, storage_options: dict, master_addr: str, master_port: int) -> None:
        """Join the trainer group and load the model (from a local or s3:// HF directory)."""
        model_path = self.model_dir = localize(model_uri, storage_options)
        torch.set_num_threads(self.cfg.cluster.threads_per_worker)
        init_distributed(self.rank, self.world_size, master_addr, master_port)
        alg = self.cfg.algorithm
        torch.manual_seed(alg.seed)
        self.model = self._load(model_path, trainable=True)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=alg.lr, betas=alg.betas, weight_decay=alg.weight_decay
        )
        warmup = alg.warmup_steps
        self.scheduler = LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
        )
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
        )
        return {**metrics, "rollout_id": rollout_id, "time_train_s": time.perf_counter() - start}

    # --- weight sync: trainer rank 0 is rank 0 of a group with every engine ---------------

    def init_weight_update_group(self, engine_urls: list[str], group_name: str) -> None:
        if self.rank != 0:
            return
        addr, port, size = self._address, free_port(self._address), 1 + len(engine_urls)
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        clients = [EngineClient(url, self.cfg.rollout.request_timeout_s) for url in engine_urls]
        # Each engine's request blocks until the whole group has joined, rank 0 included.
        with ThreadPoolExecutor(max_workers=len(clients)) as pool:
            joins = [
                pool.submit(c.init_weights_update_group, addr, port, 1 + i, size, group_name, backend)
                for i, c in enumerate(clients)
            ]
            self._group = open_update_group(addr, port, 0, size, group_name=group_name, backend=backend)
            for join in joins:
                join.result()
        self._clients, self._group_name = clients, group_name

    def update_weights(self, weight_version: int) -> dict:
        """Push all parameters to the engines; every rank must call it (gathers are collective)."""
        if self.rank == 0 and self._group is None:
            raise RuntimeError("update_weights before init_weight_update_group")
        start, nbytes = time.perf_counter(), 0
        params = dict(self.model.named_parameters())
        sizes = [(name, p.numel() * p.element_size()) for name, p in params.items()]
        buckets = bucket_params(sizes, int(self.cfg.weight_sync.bucket_size_mb * 2**20))
        with torch.no_grad():
            for i, names in enumerate(buckets):
                tensors = [_full(params[name]).contiguous() for name in names]
                nbytes += sum(t.numel() * t.element_size() for t in tensors)
                if self.rank == 0:
                    self._send_bucket(names, tensors, i == len(buckets) - 1, str(weight_version))
        return {"time_sync_s": time.perf_counter() - start, "num_buckets": len(buckets), "bytes": nbytes}

    def _send_bucket(self, names: list[str], tensors: list[torch.Tensor], last: bool, version: str) -> None:
        dtypes = [dtype_name(t.dtype) for t in tensors]
        shapes = [list(t.shape) for t in tensors]
        with ThreadPoolExecutor(max_workers=len(self._clients)) as pool:
            args = (
                names,
                dtypes,
                shapes,
                self._group_name,
                last,
                version,
            )  # ..., flush_cache, weight_version
            posts = [pool.submit(c.update_weights_from_distributed, *args) for c in self._clients]
            broadcast_bucket(self._group, tensors)
            for post in posts:
                post.result()

    def check_weights_equal(self, engine_urls: list[str], engine_dtype: str | None = None) -> dict:
        """Compare every parameter bitwise with every engine (all ranks gather; rank 0 compares).

        `engine_dtype` (e.g. "bfloat16") is what engines store when it differs from the
        trainer's fp32 master weights; the trainer's values are cast to it first.
        """
        clients = [EngineClient(url, self.cfg.rollout.request_timeout_s) for url in engine_urls]
        mismatch, checked = None, 0
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                full = _full(param)  # keep gathering after a mismatch: the other ranks wait on it
                checked += 1
                if self.rank != 0 or mismatch:
                    continue
                cast = getattr(torch, engine_dtype) if engine_dtype else full.dtype
                expected = full.to(cast).double().flatten().cpu()
                for url, client in zip(engine_urls, clients, strict=True):
                    got = torch.tensor(client.get_weights_by_name(name), dtype=torch.float64)
                    if got.shape != expected.shape:
                        mismatch = (
                            f"{name}: engine {url} has {got.numel()} values, trainer {expected.numel()}"
                        )
                    elif not torch.equal(got, expected):
                        diff = (got - expected).abs().max().item()
                        mismatch = f"{name}: engine {url} differs from the trainer (max abs diff {diff:.3g})"
                    if mismatch:
                        break
        if mismatch:
            raise WeightMismatchError(mismatch)
        return {"weights_checked": checked, "max_abs_diff": 0.0}

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

    def save_checkpoint(self, path: str, storage_options: dict) -> None:
        save_state(self._dcp_state(), path, storage_options)

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
        if self._group is not None:
            self._group.shutdown()
            self._group = None
        if dist.is_initialized():
            dist.destroy_process_group()
