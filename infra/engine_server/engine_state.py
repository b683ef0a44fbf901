"""What the built-in engine server holds: the model, its weight version, the weight-update
groups, its LoRA adapters, and the abort flags of in-flight requests.

Every method that touches the weights runs in a worker thread and takes `lock`: one
generation batch or one weight update at a time, so weights never change mid-generation
and a sample's weight version is exact.
"""

from __future__ import annotations

import os
import socket
import threading
import time

import torch
from transformers import AutoModelForCausalLM

from infra.engine_server.guards import Progress, RowAborts
from infra.engine_server.lora_adapters import LoraAdapter, read_adapter
from infra.engine_server.lora_registry import LoraRegistry
from infra.engine_server.memory import WeightOffload
from infra.engine_server.protocol import BadRequest
from infra.engine_server.sampling import RowSeeds, SampleOut, sample_batch
from infra.model.tokenizer import load_tokenizer
from infra.weights.buckets import FLATTENED_BUCKET
from infra.weights.group import broadcast, broadcast_async, close_update_group, open_update_group


class GroupJoinTimeout(RuntimeError):
    """A weight-update group's master did not accept a connection within the group timeout."""


def wait_for_master(address: str, port: int, timeout_s: float, group: str) -> None:
    """Return once `address:port` (trainer rank 0's store) accepts a TCP connection.

    torch's store client retries a dead master for about twice its timeout and then names
    neither the group nor its role; here the join fails within `timeout_s`, saying whom it
    waited for. The master may start listening a little after the engines are asked to
    join, so refused connections are retried until the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            socket.create_connection((address, port), timeout=max(0.1, min(left, 5.0))).close()
            return
        except OSError as exc:
            if time.monotonic() + 0.2 >= deadline:
                raise GroupJoinTimeout(
                    f"master_address: weight-update group {group!r}: the master {address}:{port} did not "
                    f"accept a connection within the group timeout of {timeout_s:g} s "
                    f"({type(exc).__name__}: {exc})"
                ) from exc
            time.sleep(0.2)


def parse_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise BadRequest(f"dtypes: unknown dtype {name!r}")
    return dtype


def _receive_flat(
    group: torch.distributed.ProcessGroup,
    names: list[str],
    dtypes: list[torch.dtype],
    sizes: list[torch.Size],
    device: str,
) -> dict[str, torch.Tensor]:
    """One uint8 broadcast of the tensors' bytes back to back; views of it, by name."""
    offsets, total = [], 0
    for name, dtype, size in zip(names, dtypes, sizes, strict=True):
        if total % dtype.itemsize:  # SGLang refuses it too: a view needs aligned bytes
            raise BadRequest(f"names: {name!r} starts at byte {total}, not aligned for {dtype}")
        offsets.append(total)
        total += size.numel() * dtype.itemsize
    flat = torch.empty(total, dtype=torch.uint8, device=device)
    broadcast(group, flat, src=0)
    return {
        name: flat[start : start + size.numel() * dtype.itemsize].view(dtype).view(size)
        for name, dtype, size, start in zip(names, dtypes, sizes, offsets, strict=True)
    }


def _rows_by_adapter(adapters: list[LoraAdapter | None]) -> list[tuple[LoraAdapter | None, list[int]]]:
    """The rows of each adapter, in order of first appearance."""
    groups: dict[LoraAdapter | None, list[int]] = {}
    for row, adapter in enumerate(adapters):
        groups.setdefault(adapter, []).append(row)
    return list(groups.items())


class EngineState:
    def __init__(
        self,
        model_path: str,
        seed: int,
        weight_version: str,
        session: bool = True,
        group_timeout_s: float = 120.0,
    ):
        # a join or broadcast whose peer never comes fails after this, freeing its thread
        self.group_timeout_s = group_timeout_s
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        # float32 on CPU (no fast bf16 kernels there); the checkpoint's own dtype on GPU
        dtype = "auto" if self.device.type == "cuda" else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(self.device).eval()
        self.tokenizer = load_tokenizer(model_path)
        self.model_path = model_path
        self.weight_version = weight_version
        self.lock = threading.Lock()
        # advanced by every request without a sampling_seed, so a run is reproducible
        # given the server seed and the order of requests
        self.generator = torch.Generator().manual_seed(seed)
        self.groups: dict[str, tuple[torch.distributed.ProcessGroup, str]] = {}
        self._aborts: dict[str, list[tuple[RowAborts, int]]] = {}  # rid -> (request's flags, row)
        self._aborts_lock = threading.Lock()
        self.session = session  # speak the update-session protocol (SGLang >= 0.5.23)
        self._session_open = False
        self.offload = WeightOffload(self.model)
        self.loras = LoraRegistry(lambda name, path: read_adapter(name, path, self.model))

    # ---- generation -------------------------------------------------------------------

    def register(self, rids: list[str], progress: Progress | None = None) -> RowAborts:
        """The abort flags of a request's sampled rows, each reachable by its row's rid."""
        aborts = RowAborts(len(rids), progress)
        with self._aborts_lock:
            for row, rid in enumerate(rids):
                self._aborts.setdefault(rid, []).append((aborts, row))
        return aborts

    def unregister(self, rids: list[str], aborts: RowAborts) -> None:
        with self._aborts_lock:
            for rid in rids:
                held = [entry for entry in self._aborts.get(rid, []) if entry[0] is not aborts]
                if held:
                    self._aborts[rid] = held
                else:
                    self._aborts.pop(rid, None)

    def abort(self, rid: str = "", abort_all: bool = False) -> None:
        """As SGLang: a rid that is in flight aborts every in-flight rid it prefixes; an
        unknown rid (or an empty one without abort_all) aborts nothing."""
        with self._aborts_lock:
            if abort_all:
                hit = list(self._aborts)
            elif rid and rid in self._aborts:
                hit = [r for r in self._aborts if r.startswith(rid)]
            else:
                hit = []
            for r in hit:
                for aborts, row in self._aborts[r]:
                    aborts.set(row)

    def generate(
        self,
        prompts: list[list[int]],
        params: dict,
        seed: int | list[int] | None,
        aborts: RowAborts,
        adapters: list[LoraAdapter | None] | None = None,
    ) -> tuple[list[SampleOut], str]:
        """Sample all prompts; returns the outputs and the weight version used.

        `seed`: None draws from the server's stream; an int seeds one generator for the
        batch; a list seeds one generator per row. `adapters`: each row's LoRA adapter
        (None: the base weights); the rows of each adapter run as one batch, in turn."""
        with self.lock:
            self.require_resident()
            if seed is None:
                generator = self.generator
            elif isinstance(seed, list):
                generator = RowSeeds(seed)
            else:
                generator = torch.Generator().manual_seed(seed)
            outs: list[SampleOut] = [SampleOut()] * len(prompts)
            for adapter, rows in _rows_by_adapter(adapters or [None] * len(prompts)):
                done = sample_batch(
                    self.model,
                    [prompts[i] for i in rows],
                    eos_token_id=self.tokenizer.eos_token_id,
                    generator=generator.subset(rows) if isinstance(generator, RowSeeds) else generator,
                    should_abort=lambda rows=rows: aborts.read(rows),
                    lora=adapter,
                    **params,
                )
                for i, out in zip(rows, done, strict=True):
                    outs[i] = out
            return outs, self.weight_version

    # ---- weights ----------------------------------------------------------------------

    def open_group(
        self, name: str, address: str, port: int, rank: int, world_size: int, backend: str
    ) -> None:
        if name in self.groups:
            raise BadRequest(f"group_name: weight-update group {name!r} already exists")
        # refused before waiting for the master: no wait can fix these
        if backend == "nccl" and not torch.distributed.is_nccl_available():
            raise BadRequest("backend: nccl is not available in this torch build (CPU only); use gloo")
        if not 0 <= rank < world_size:
            raise BadRequest(f"rank_offset: {rank} is outside the group of {world_size}")
        started = time.monotonic()
        wait_for_master(address, port, self.group_timeout_s, name)
        left = max(1.0, self.group_timeout_s - (time.monotonic() - started))
        try:
            # Blocks until every rank (trainer rank 0 included) has joined.
            group = open_update_group(
                address, port, rank, world_size, group_name=name, timeout_s=left, backend=backend
            )
        except RuntimeError as exc:  # torch's DistNetworkError / DistStoreError among them
            raise RuntimeError(
                f"weight-update group {name!r}: joining master {address}:{port} as rank {rank} of "
                f"{world_size} failed: {type(exc).__name__}: {exc}"
            ) from exc
        self.groups[name] = (group, backend)

    def close_group(self, name: str) -> None:
        group, _ = self._group(name)
        del self.groups[name]
        close_update_group(group)

    def _group(self, name: str) -> tuple[torch.distributed.ProcessGroup, str]:
        if name not in self.groups:
            raise BadRequest(f"group_name: no weight-update group {name!r} (known: {sorted(self.groups)})")
        return self.groups[name]

    def model_info(self) -> dict:
        """`/model_info`, the fields SGLang answers that this engine knows."""
        config = self.model.config
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "is_generation": True,
            "weight_version": self.weight_version,
            "model_type": getattr(config, "model_type", None),
            "architectures": getattr(config, "architectures", None),
        }

    def begin_update(self) -> str | None:
        if self._session_open:
            return "a weight-update session is already open; call end_weight_update() first"
        self._session_open = True
        return None

    def end_update(self) -> str | None:
        if not self._session_open:
            return "no weight-update session is open; call begin_weight_update() first"
        self._session_open = False
        return None

    def update_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str,
        version: str | None,
        load_format: str | None = None,
        timings: dict[str, float] | None = None,
    ) -> str | None:
        """Receive the named tensors from rank 0 of the group and load them; an error or None.

        `load_format` None: one broadcast per tensor, in order; "flattened_bucket": one uint8
        broadcast holding them back to back (SGLang's FlattenedTensorBucket layout). The
        seconds spent receiving and loading are added to `timings` when given."""
        # A malformed request is refused before any receive; the trainer's broadcast then
        # fails by the group's timeout, and its POST sees this 400.
        if not len(names) == len(dtypes) == len(shapes):
            raise BadRequest(
                f"names/dtypes/shapes: lengths differ ({len(names)}, {len(dtypes)}, {len(shapes)})"
            )
        if load_format not in (None, FLATTENED_BUCKET):
            raise BadRequest(
                f"load_format: {load_format!r} is not supported here (None or {FLATTENED_BUCKET!r})"
            )
        if self.session and not self._session_open:
            # refused before any receive, as SGLang does: the sender's broadcast then times out
            return (
                "update_weights_from_distributed must run between "
                "begin_weight_update() and end_weight_update()"
            )
        group, backend = self._group(group_name)
        parsed = [parse_dtype(d) for d in dtypes]
        sizes = [torch.Size(shape) for shape in shapes]
        # gloo moves CPU tensors, nccl GPU tensors
        device = "cuda" if backend == "nccl" else "cpu"
        with self.lock:
            self.require_resident()
            t0 = time.perf_counter()
            # Receive everything before validating: the trainer broadcasts all tensors
            # regardless, and skipping a receive would leave it hanging in a collective.
            if load_format == FLATTENED_BUCKET:
                received = _receive_flat(group, names, parsed, sizes, device)
            else:
                received = {}
                works = []  # all receives in flight at once, as SGLang posts them
                for name, dtype, size in zip(names, parsed, sizes, strict=True):
                    received[name] = torch.empty(size, dtype=dtype, device=device)
                    works.append(broadcast_async(group, received[name], src=0))
                for work in works:
                    work.wait()
            t1 = time.perf_counter()
            # a flattened bucket's views are this request's own buffer: the weights adopt it
            error = self._load(received, version, adopt=load_format == FLATTENED_BUCKET)
            if timings is not None:
                timings["time_receive_s"] = t1 - t0
                timings["time_load_s"] = time.perf_counter() - t1
            return error

    def update_from_disk(self, model_path: str, version: str | None) -> str | None:
        dtype = next(self.model.parameters()).dtype
        if not os.path.isfile(os.path.join(model_path, "config.json")):
            # checked first: from_pretrained would take a non-directory for a hub name
            return f"model_path: {model_path!r} is not an HF model directory (no config.json in it)"
        with self.lock:
            self.require_resident()
            try:
                fresh = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
            except Exception as exc:  # noqa: BLE001 - transformers raises many kinds for a bad directory
                return f"model_path: cannot load {model_path!r}: {type(exc).__name__}: {exc}"
            error = self._load(fresh.state_dict(), version)
            if error is None:
                self.model_path = model_path
            return error

    def _load(self, tensors: dict[str, torch.Tensor], version: str | None, adopt: bool = False) -> str | None:
        """Copy all tensors into the model, or none of them if any name or shape is wrong.

        `adopt`: the tensors belong to no one else, so a parameter of the same dtype and
        device takes the tensor itself as its data instead of a copy (a received flat
        bucket then backs its parameters until the next update replaces them all)."""
        targets = self.model.state_dict()
        unknown = [n for n in tensors if n not in targets]
        if unknown:
            return f"unknown parameter name(s): {unknown}"
        misshapen = [
            f"{n} {list(t.shape)} != {list(targets[n].shape)}"
            for n, t in tensors.items()
            if t.shape != targets[n].shape
        ]
        if misshapen:
            return f"shape mismatch: {misshapen}"
        params = dict(self.model.named_parameters(remove_duplicate=False)) if adopt else {}
        with torch.no_grad():
            for name, tensor in tensors.items():
                param = params.get(name)
                if param is not None and (param.dtype, param.device) == (tensor.dtype, tensor.device):
                    param.data = tensor  # a tied weight is one Parameter: both names follow
                else:
                    targets[name].copy_(tensor)
        if version is not None:
            self.weight_version = version
        return None

    def weights_by_name(self, name: str, truncate_size: int) -> list:
        """As SGLang: the tensor cast to float32, as nested lists, its first `truncate_size`
        rows (a 1-D tensor: its first values)."""
        params = self.model.state_dict()
        if name not in params:
            raise BadRequest(f"name: unknown parameter {name!r}")
        with self.lock:  # never read a tensor half-way through an update
            self.require_resident()
            values = params[name].detach().cpu().to(torch.float32).tolist()
        return values[:truncate_size]

    # ---- memory occupation (colocated mode) -------------------------------------------

    def require_resident(self) -> None:
        if self.offload.released:
            raise BadRequest(
                "engine memory is released (/release_memory_occupation): "
                "call /resume_memory_occupation before generating or updating weights"
            )

    def release_memory(self, tags: list[str] | None) -> int:
        """Free the weights (tags None or containing "weights"); returns the bytes freed.

        Other SGLang tags ("kv_cache", "cuda_graph") hold nothing here: this server
        allocates its KV cache per batch and frees it when the batch ends.
        """
        with self.lock:  # after any batch in flight
            if tags is None or "weights" in tags:
                return self.offload.release()
            return 0

    def resume_memory(self, tags: list[str] | None) -> None:
        with self.lock:
            if tags is None or "weights" in tags:
                self.offload.resume()
