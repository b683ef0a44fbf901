"""The sgl_kernel stand-in: every name imports, every call raises and is recorded."""

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
