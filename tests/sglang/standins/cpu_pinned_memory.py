"""Let SGLang's LoRA code ask for pinned memory on a CPU-only torch.

SGLang 0.5.23's LoRA layers and backends stage small index tensors in pinned host memory
(`torch.tensor(..., pin_memory=True)`, `torch.empty(..., pin_memory=True)`) whatever the
device, for asynchronous copies to a GPU. A CPU-only torch has no pinned-memory allocator
and raises ("pin_memory=True requires a CUDA or other accelerator backend"), so a server
launched with `--enable-lora` dies at start. Pinning only speeds host-to-device copies; with
no device, an ordinary tensor holds the same values. So once torch is imported, and only
when it sees no accelerator, `pin_memory=True` is dropped from torch's factory functions and
`Tensor.pin_memory()` returns the tensor itself. With an accelerator nothing changes.

What runs on CPU with this: SGLang's torch_native LoRA backend only (`--lora-backend
torch_native`, what the project's CPU launch passes). SGLang's GPU LoRA backends (csgmv,
the default, and triton) run triton kernels: they are not tested here.

The venv loads this module at start-up (a `.pth` line), before any import of torch; it
imports nothing heavy itself and patches torch when torch's own import finishes.
"""

from __future__ import annotations

import functools
import importlib.abc
import sys

# torch's factory functions that take `pin_memory` (SGLang's LoRA code uses the first four)
_FACTORIES = (
    "tensor",
    "empty",
    "zeros",
    "arange",
    "ones",
    "full",
    "empty_strided",
    "empty_like",
    "zeros_like",
    "ones_like",
    "full_like",
)


def _unpinned(factory):
    @functools.wraps(factory)
    def make(*args, **kwargs):
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        return factory(*args, **kwargs)

    return make


def _same_tensor(self, device=None):
    return self


def patch(torch) -> bool:
    """Make pinning a no-op on this torch if it has no accelerator; True when it did."""
    if torch.accelerator.is_available():
        return False
    for name in _FACTORIES:
        setattr(torch, name, _unpinned(getattr(torch, name)))
    torch.Tensor.pin_memory = _same_tensor
    return True


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    """Finds `torch` through the finders after it, and patches it once its import has run."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)  # once: torch is imported once per process
        for finder in sys.meta_path:
            spec = getattr(finder, "find_spec", lambda *a: None)(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module = _then_patch(spec.loader.exec_module)
                return spec
        return None


def _then_patch(exec_module):
    def exec_then_patch(module):
        exec_module(module)
        patch(module)

    return exec_then_patch


if "torch" in sys.modules:
    patch(sys.modules["torch"])
else:
    sys.meta_path.insert(0, _AfterTorchImport())
