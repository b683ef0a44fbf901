"""Releasing a model's weight memory and getting it back (colocated mode).

While a colocated trainer trains, the engine beside it must give up its device memory.
On CUDA the weights move to host memory and the CUDA cache is emptied, so the GPU memory
is really free; on CPU they go to a temporary safetensors file, so host memory is freed
too. Resume copies them back exactly, into tensors of the same shape, dtype and device.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file


def _return_free_heap() -> None:
    # glibc keeps freed blocks in its heap (its mmap threshold grows after large frees), so
    # dropped CPU tensors would still count against the machine; hand them back to the OS.
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)


class WeightOffload:
    def __init__(self, model: torch.nn.Module):
        self.model = model
        self._meta: list[tuple[torch.dtype, torch.device]] = []
        self._host: dict[str, torch.Tensor] = {}
        self._file: str | None = None

    @property
    def released(self) -> bool:
        return bool(self._meta)

    def _tensors(self) -> list[torch.Tensor]:
        # parameters() yields a tied tensor once; buffers (rotary tables) are derived, but
        # released too so that nothing of the model stays on the device
        return [*self.model.parameters(), *self.model.buffers()]

    def release(self) -> int:
        """Drop every weight's storage, keeping a copy off the device; returns the bytes freed."""
        if self.released:
            return 0
        tensors = self._tensors()
        freed = sum(t.numel() * t.element_size() for t in tensors)
        copies = {str(i): t.detach().to("cpu", copy=True).contiguous() for i, t in enumerate(tensors)}
        on_cuda = any(t.device.type == "cuda" for t in tensors)
        if on_cuda:
            self._host = copies
        else:
            fd, self._file = tempfile.mkstemp(prefix="prl-weights-", suffix=".safetensors")
            os.close(fd)
            save_file(copies, self._file)
            copies.clear()
        self._meta = [(t.dtype, t.device) for t in tensors]
        for t in tensors:
            t.data = torch.empty(0, dtype=t.dtype, device=t.device)
        if on_cuda:
            torch.cuda.empty_cache()
        else:
            _return_free_heap()
        return freed

    def resume(self) -> None:
        """Put every weight back where it was, bit for bit."""
        if not self.released:
            return
        if self._file is not None:
            copies = load_file(self._file)
            os.unlink(self._file)
            self._file = None
        else:
            copies, self._host = self._host, {}
        for i, (t, (dtype, device)) in enumerate(zip(self._tensors(), self._meta, strict=True)):
            # a fresh allocation, not the loaded tensor itself: safetensors hands back CPU
            # tensors at whatever address its buffer gave them, and CPU matmul kernels round
            # differently for operands off the 64-byte alignment torch's allocator keeps, so
            # the same weights gave other logprobs in the last bits (measured: 1 ulp)
            copy = copies[str(i)]
            t.data = torch.empty(copy.shape, dtype=dtype, device=device).copy_(copy)
        self._meta = []

    def discard(self) -> None:
        """Forget a pending copy (the server is shutting down)."""
        if self._file is not None and os.path.exists(self._file):
            os.unlink(self._file)
        self._file, self._host = None, {}
