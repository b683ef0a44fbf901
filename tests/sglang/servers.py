"""SGLang's real server, started by the project's own launch code, for the server tier.

`.venv-sglang` (make sglang-venv) runs `sglang.launch_server` on SGLang's CPU path, with the
stand-ins for triton, torchvision and sgl_kernel. Every call into the sgl_kernel stand-in is
appended to `KERNEL_CALLS`; the tier fails if one happened (`assert_no_kernel_calls`).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from infra.config import TinyModelConfig
from infra.engines.client import EngineClient
from infra.engines.launch import EngineProcess, SGLangLaunch, launch_engine, serving_url, stop_engine
from infra.model.tiny import build_tiny_model
from infra.secrets import API_KEY_ENV
from infra.weights.broadcast import BroadcastSender
from infra.weights.check import WeightCheck
from infra.weights.engines import connect_engines

KERNEL_CALLS = Path(tempfile.gettempdir()) / f"prl-sgl-kernel-calls-{os.getpid()}"
# the stand-in reads this in every SGLang process the tests start, flows' engines included
os.environ["PRL_SGL_KERNEL_CALLS"] = str(KERNEL_CALLS)
# what configs/sglang-cpu.yaml gives SGLang; a larger KV pool for the long generations
SERVER_ARGS = {"dtype": "float32", "max_total_tokens": 32768, "mem_fraction_static": 0.1}
STARTUP_TIMEOUT_S = 240  # 14-47 s measured; a loaded 2-core CI machine is slower


def long_context_model(root: Path) -> Path:
    """The built-in tiny Llama with room for prompts plus >= 400 new tokens."""
    return build_tiny_model(root, TinyModelConfig(max_position_embeddings=1024))


@dataclass
class RealServer:
    url: str
    proc: EngineProcess
    log_path: str
    api_key: str

    def client(self, timeout_s: float = 300) -> EngineClient:
        return EngineClient(self.url, timeout_s)


@contextmanager
def real_sglang_server(
    python: str,
    model_dir: Path,
    log_dir: Path,
    api_key: str,
    tp_size: int = 1,
    lora_rank: int = 0,
    lora_targets: tuple[str, ...] = (),
) -> Iterator[RealServer]:
    """One SGLang server on loopback, launched as an engine actor launches it (API key set);
    with `lora_rank`, serving LoRA adapters as adapter sync launches it."""
    previous = os.environ.get(API_KEY_ENV)
    os.environ[API_KEY_ENV] = api_key  # what a run sets for every process
    log_path = str(log_dir / f"sglang-{len(list(log_dir.iterdir()))}.log")
    proc = launch_engine(
        "sglang",
        str(model_dir),
        "127.0.0.1",
        0,  # as the engine actor launches it: the server binds a free port itself
        seed=1,
        threads=1,
        extra_args=SERVER_ARGS,
        log_path=log_path,
        sglang=SGLangLaunch(
            python=python, tp_size=tp_size, cpu=True, lora_rank=lora_rank, lora_targets=lora_targets
        ),
    )
    try:
        url = serving_url(proc, STARTUP_TIMEOUT_S)
        yield RealServer(url, proc, log_path, api_key)
    finally:
        stop_engine(proc)
        if previous is None:
            os.environ.pop(API_KEY_ENV, None)
        else:
            os.environ[API_KEY_ENV] = previous


def assert_no_kernel_calls() -> None:
    calls = KERNEL_CALLS.read_text() if KERNEL_CALLS.exists() else ""
    assert not calls, f"SGLang called the sgl_kernel stand-in (a kernel path CPUs cannot run):\n{calls}"


def perturbed_params(model_dir: Path, seed: int):
    """The model's parameters moved by a seeded noise: weights no engine holds yet."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    return {n: p.detach() + 0.01 * torch.randn(p.shape, generator=gen) for n, p in model.named_parameters()}


def broadcast_sync(
    url: str, model_dir: Path, params: dict, version: str, timeout_s: float, tp_size: int = 1
) -> dict:
    """One whole broadcast sync as trainer rank 0 does it (pause, session, buckets, resume),
    then the weight check; returns the check's report and the sync's seconds."""
    model_config = json.loads((model_dir / "config.json").read_text())
    links = connect_engines([url], tp_size, model_config, timeout_s)
    sender = BroadcastSender(links, f"tier-{version}-{os.getpid()}", timeout_s=timeout_s)
    t0 = time.monotonic()
    sender.open("127.0.0.1", 0, "gloo")  # the port the OS picks, bound before the engine hears it
    try:
        names = list(params)
        with sender.session():
            for i in range(0, len(names), 8):
                bucket = names[i : i + 8]
                sender.send_bucket(bucket, [params[n] for n in bucket], i + 8 >= len(names), version)
        seconds = time.monotonic() - t0
    finally:
        sender.close()
    check = WeightCheck(links)
    for name, tensor in params.items():
        check.compare(name, tensor)
    return {**check.raise_on_mismatch(), "seconds": seconds}
