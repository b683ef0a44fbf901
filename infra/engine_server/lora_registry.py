"""The LoRA adapters a built-in engine serves, by name, with SGLang 0.5.23's semantics.

- Loading a name that is loaded is refused (400); so is a directory the engine cannot
  serve (`lora_adapters`).
- A request names adapters in `lora_path`; a name never loaded is refused (400).
- Unloading takes the name away at once, then waits for the requests using the adapter
  to finish before it answers: they run to the end with it.
- A name that was unloaded is loaded again from its directory by the next request naming
  it, as SGLang does; when the directory is gone, that request is refused (400).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from infra.engine_server.lora_adapters import LoraAdapter
from infra.engine_server.protocol import BadRequest


class AlreadyLoaded(BadRequest):
    """A load of a name that is loaded."""


class LoraRegistry:
    def __init__(self, read: Callable[[str, str], LoraAdapter]) -> None:
        self._read = read  # (name, path) -> the adapter, or BadRequest
        self._loaded: dict[str, LoraAdapter] = {}
        self._paths: dict[str, str] = {}  # every name ever loaded, for the reload on request
        self._unloading: set[str] = set()
        self._users: dict[LoraAdapter, int] = {}
        self._cond = threading.Condition()

    def loaded(self) -> dict[str, str]:
        """Name -> directory of every loaded adapter (SGLang's `loaded_adapters`)."""
        with self._cond:
            return {name: adapter.path for name, adapter in self._loaded.items()}

    def _refuse_duplicate(self, name: str) -> None:
        if name in self._loaded or name in self._unloading:
            raise AlreadyLoaded(f"lora_name: LoRA adapter {name!r} is already loaded")

    def load(self, name: str, path: str) -> dict[str, str]:
        with self._cond:
            self._refuse_duplicate(name)
        adapter = self._read(name, path)  # reads files: outside the lock
        with self._cond:
            self._refuse_duplicate(name)
            self._loaded[name] = adapter
            self._paths[name] = path
        return self.loaded()

    def unload(self, name: str) -> dict[str, str]:
        """Take `name` away, then wait until no request uses its adapter any more."""
        with self._cond:
            adapter = self._loaded.pop(name, None)
            if adapter is None:
                raise BadRequest(
                    f"lora_name: LoRA adapter {name!r} is not loaded (loaded: {sorted(self._loaded)})"
                )
            self._unloading.add(name)
            try:
                self._cond.wait_for(lambda: not self._users.get(adapter))
            finally:
                self._unloading.discard(name)
        return self.loaded()

    def acquire(self, names: list[str | None]) -> list[LoraAdapter | None]:
        """The adapter of every name (None: the base weights), held until `release`."""
        wanted = sorted({name for name in names if name is not None})
        for name in wanted:
            self._reload_if_unloaded(name)
        with self._cond:
            gone = [name for name in wanted if name not in self._loaded]
            if gone:  # unloaded between the reload and here
                raise BadRequest(f"lora_path: LoRA adapter(s) {gone} were unloaded meanwhile")
            adapters = {name: self._loaded[name] for name in wanted}
            for adapter in adapters.values():
                self._users[adapter] = self._users.get(adapter, 0) + 1
        return [adapters[name] if name is not None else None for name in names]

    def release(self, adapters: list[LoraAdapter | None]) -> None:
        with self._cond:
            for adapter in {a for a in adapters if a is not None}:
                self._users[adapter] -= 1
                if not self._users[adapter]:
                    del self._users[adapter]
            self._cond.notify_all()

    def _reload_if_unloaded(self, name: str) -> None:
        with self._cond:
            if name in self._loaded:
                return
            path = self._paths.get(name)
            if path is None:
                raise BadRequest(
                    f"lora_path: LoRA adapter {name!r} has never been loaded (loaded: {sorted(self._loaded)})"
                )
            if name in self._unloading:
                raise BadRequest(f"lora_path: LoRA adapter {name!r} is being unloaded")
        try:
            self.load(name, path)
        except AlreadyLoaded:
            pass  # another request loaded it again first
        except BadRequest as exc:
            raise BadRequest(
                f"lora_path: failed to load unloaded LoRA adapter {name!r} again: {exc}"
            ) from exc
