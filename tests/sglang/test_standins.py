"""The stand-ins: sgl_kernel's names import and every call raises and is recorded; pinned
memory asked of a CPU-only torch is plain memory."""

from __future__ import annotations

import subprocess

import pytest

from tests.sglang.conftest import sglang_env

pytestmark = pytest.mark.sglang

PROBE = """
import sgl_kernel
from sgl_kernel import rmsnorm, silu_and_mul
from sgl_kernel.flash_attn import flash_attn_varlen_func
try:
    rmsnorm(1, 2)
except sgl_kernel.KernelCalled as exc:
    print("raised:", exc)
"""


def test_sgl_kernel_names_import_and_every_call_raises_and_is_counted(sglang_python: str, tmp_path):
    calls = tmp_path / "calls"
    env = {**sglang_env(), "PRL_SGL_KERNEL_CALLS": str(calls)}
    done = subprocess.run([sglang_python, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "raised: sgl_kernel.rmsnorm: a stand-in" in done.stdout
    assert calls.read_text().split()[1:] == ["sgl_kernel.rmsnorm"]


PINNED_PROBE = """
import torch
t = torch.tensor([0, 16], dtype=torch.int32, device="cpu", pin_memory=True)
e = torch.empty(3, dtype=torch.int32, pin_memory=True)
print("made:", t.tolist(), tuple(e.shape), t.pin_memory() is t, torch.accelerator.is_available())
"""

# the same torch, imported without the venv's start-up hooks (-S: no .pth runs)
BARE_PROBE = """
import sys
sys.path.append(sys.argv[1])
import torch
try:
    torch.tensor([0, 16], dtype=torch.int32, pin_memory=True)
except RuntimeError as exc:
    print("raised:", exc)
"""


def test_pinned_memory_on_a_cpu_only_torch_is_plain_memory(sglang_python: str):
    """SGLang's LoRA layers pin small tensors at start; a CPU-only torch raises there."""

    def run(*args: str) -> str:
        done = subprocess.run(args, env=sglang_env(), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "made: [0, 16] (3,) True False" in run(sglang_python, "-c", PINNED_PROBE)
    where = "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))"
    site = run(sglang_python, "-c", where).strip().splitlines()[-1]
    bare = run(sglang_python, "-S", "-c", BARE_PROBE, site)
    assert "raised: pin_memory=True requires a CUDA or other accelerator backend" in bare
