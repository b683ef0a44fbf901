"""Inert packages: every attribute and every submodule exists and does nothing.

The stand-ins for `triton` and `torchvision` are built from this. SGLang's modules touch
those packages at import time only (decorators, constants, `import ... as T`); the
conformance tests never run a kernel or an image transform, and anything that tries to
gets an inert object back instead of a result, so it cannot pass by accident.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

# names whose calls build decorators or kernel configs when a module is imported
_FACTORIES = {"jit", "autotune", "heuristics", "Config", "constexpr"}


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


class Inert:
    """Any attribute, index or base class; a decorator that returns the function; other calls fail."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> Inert:
        if _dunder(attr):
            raise AttributeError(attr)
        return Inert(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], Inert):
            return args[0]  # @triton.jit, @triton.autotune(...)(fn), @triton.heuristics(...)(fn)
        if self._name.rsplit(".", 1)[-1] in _FACTORIES:
            return Inert(f"{self._name}()")  # @triton.jit(...), triton.Config(...) at import time
        # anything else would need the real package: fail, so probing code takes its
        # no-GPU path (SGLang's platform checks catch this) and nothing computes by accident
        raise RuntimeError(f"{self._name}: a stand-in, this machine has no GPU kernels")

    def __getitem__(self, key) -> Inert:
        return Inert(f"{self._name}[]")

    def __iter__(self):
        return iter(())

    def __mro_entries__(self, bases):
        return (object,)  # `class K(triton.runtime.KernelInterface)` becomes a plain class

    def __repr__(self) -> str:
        return f"<stand-in {self._name}>"


class InertModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Inert:
        if _dunder(attr):
            raise AttributeError(attr)
        return Inert(f"{self.__name__}.{attr}")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        module = InertModule(spec.name)
        module.__path__ = []  # a package, so deeper submodules resolve through the finder too
        return module

    def exec_module(self, module) -> None:
        pass


class _SubmoduleFinder(importlib.abc.MetaPathFinder):
    def __init__(self, package: str):
        self.prefix = f"{package}."

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(self.prefix):
            return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)
        return None


def make_inert(package: types.ModuleType) -> None:
    """Turn `package` (its own __init__ calls this) into an inert package."""
    sys.meta_path.append(_SubmoduleFinder(package.__name__))
    package.__class__ = InertModule
