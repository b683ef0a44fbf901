"""A Ray actor that owns one engine server process on its placement bundle.

The server is a child process of the actor (and dies with it), so placement, GPUs and
cleanup are Ray's business while generation speaks plain SGLang HTTP.
"""

from __future__ import annotations

import os
import tempfile

from infra.cluster.network import advertise_address
from infra.config import RunConfig
from infra.engines.client import EngineClient, paused
from infra.engines.launch import (
    SGLangLaunch,
    launch_engine,
    serving_url,
    sglang_interpreter,
    stop_engine,
)
from infra.model.loading import copy_adapter, localize


class EngineActor:
    def __init__(self, cfg: RunConfig, index: int, local_cluster: bool):
        self.cfg = cfg
        self.index = index
        self.local_cluster = local_cluster
        self.proc = None
        self.url = ""
        self.log_path = os.path.join(tempfile.gettempdir(), f"prl-engine-{os.getpid()}-{index}.log")

    def start(self, model_uri: str, storage_options: dict) -> str:
        host = advertise_address(self.local_cluster)
        model_dir = localize(model_uri, storage_options)
        # port 0: the server binds a free port itself, and the URL names the one it bound
        # (a port chosen here could be taken by another process before the server binds it)
        self.proc = launch_engine(
            self.cfg.rollout.engine,
            model_dir,
            host,
            0,
            seed=self.cfg.rollout.seed + self.index,
            threads=self.cfg.cluster.threads_per_worker,
            extra_args=self.cfg.rollout.sglang_args,
            log_path=self.log_path,
            sglang=sglang_launch(self.cfg),
            group_timeout_s=self.cfg.weight_sync.timeout_s,
        )
        self.url = serving_url(self.proc, self.cfg.rollout.startup_timeout_s)
        return self.url

    def load_weights_from_disk(self, uri: str, storage_options: dict, weight_version: str) -> None:
        """Disk weight sync: the server needs a local path, so a remote (s3://) export is
        downloaded on this node first, and removed once the server has loaded it. Generation
        is paused around the load (see `paused`), so it never waits behind a running one."""
        with tempfile.TemporaryDirectory(prefix="prl-weights-") as tmp:
            local = localize(uri, storage_options, cache_root=tmp)
            with EngineClient(self.url, self.cfg.rollout.request_timeout_s) as client, paused(client):
                client.update_weights_from_disk(local, weight_version)

    def load_lora_from_disk(self, uri: str, storage_options: dict, lora_name: str) -> None:
        """Adapter sync: the PEFT adapter directory at `uri` (local or s3://) is copied to this
        node and loaded under `lora_name`, which requests then give as `lora_path`. The copy
        is removed once loaded (the engine holds the adapter in memory), so after
        `unload_lora` the name is refused: SGLang would load it again from a directory still
        there. Generation goes on meanwhile: an adapter load leaves the base weights as they are."""
        with tempfile.TemporaryDirectory(prefix="prl-lora-") as tmp:
            local = copy_adapter(uri, storage_options, os.path.join(tmp, "adapter"))
            with EngineClient(self.url, self.cfg.rollout.request_timeout_s) as client:
                client.load_lora_adapter(lora_name, local)

    def unload_lora(self, lora_name: str) -> None:
        """Unload an adapter; returns once the requests using it have finished."""
        with EngineClient(self.url, self.cfg.rollout.request_timeout_s) as client:
            client.unload_lora_adapter(lora_name)

    def restart(self, model_uri: str, storage_options: dict) -> str:
        """Replace a dead or hung server with a fresh one (a new port); returns its URL.
        It serves the model's initial weights until the weight transport restores them."""
        self.stop()
        return self.start(model_uri, storage_options)

    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def stop(self) -> None:
        if self.proc is not None:
            stop_engine(self.proc)
            self.proc = None
        # the log served start-up errors (quoted in them); a stopped engine leaves nothing behind
        if os.path.exists(self.log_path):
            os.remove(self.log_path)


def sglang_launch(cfg: RunConfig) -> SGLangLaunch:
    """The SGLang launch a run's config asks for (ignored by the built-in engine). With
    adapter sync the engines serve LoRA adapters of the run's rank on its target modules;
    with merged sync they get full weights and are launched as without LoRA."""
    lora = cfg.model.lora if cfg.weight_sync.lora == "adapter" else None
    return SGLangLaunch(
        python=sglang_interpreter(cfg.rollout.sglang_python),
        tp_size=cfg.rollout.tp_size,
        cpu=cfg.cluster.engines.gpus_per_worker == 0,
        colocate=cfg.cluster.colocate,
        sleep_on_idle=cfg.rollout.sglang_sleep_on_idle,
        lora_rank=lora.r if lora else 0,
        lora_targets=tuple(lora.target_modules) if lora else (),
    )
