"""Stand-in for `sgl_kernel`, SGLang's compiled kernels (CUDA builds only on the package index).

Every name imports, so SGLang's modules load; every call raises and is counted. With the
CPU launch flags the project uses (torch-native attention, no CUDA graphs) SGLang's CPU path
calls none of them: a call means SGLang took a kernel path this machine cannot run. Each call
is appended to the file named by `PRL_SGL_KERNEL_CALLS` (when set), so a test can require
that none happened even when SGLang swallowed the error.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types

__version__ = "0.0.0+standin"
CALLS_ENV = "PRL_SGL_KERNEL_CALLS"


class KernelCalled(RuntimeError):
    """SGLang called a compiled kernel that this stand-in does not have."""


def _record(name: str) -> None:
    path = os.environ.get(CALLS_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {name}\n")


class _Kernel:
    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        _record(self._name)
        raise KernelCalled(f"{self._name}: a stand-in; no compiled sgl_kernel on this machine")

    def __getattr__(self, attr: str) -> _Kernel:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Kernel(f"{self._name}.{attr}")

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in {self._name}>"


class _KernelModule(types.ModuleType):
    def __getattr__(self, attr: str) -> _Kernel:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Kernel(f"{self.__name__}.{attr}")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        module = _KernelModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module) -> None:
        pass


class _Submodules(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(f"{__name__}."):
            return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)
        return None


sys.meta_path.append(_Submodules())
sys.modules[__name__].__class__ = _KernelModule
