"""Keep torch on its no-triton paths while SGLang's modules import the `triton` stand-in.

torch probes for triton with `try: import triton... except ImportError` in many places
(the compiler stack that SGLang's import-time `@torch.compile` decorators load, the flop
counter, ...), and on success it uses triton's classes for real. So the stand-in must
exist for SGLang and not for torch: imports of `triton` made from torch's own modules
raise ModuleNotFoundError, as on a machine without triton. The venv loads this module at
start-up (a `.pth` line), before any import of torch.
"""

from __future__ import annotations

import builtins

_import = builtins.__import__


def _blind(importer: str) -> bool:
    return importer in ("torch", "functorch") or importer.startswith(("torch.", "functorch."))


def _import_without_triton_for_torch(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and name.split(".")[0] == "triton" and _blind((globals or {}).get("__name__", "")):
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    return _import(name, globals, locals, fromlist, level)


builtins.__import__ = _import_without_triton_for_torch
