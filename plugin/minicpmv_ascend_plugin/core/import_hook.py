"""Run a callback right after a module is first imported (a post-import hook).

The MiniCPM-V 4.6 backports patch classes of `vllm.model_executor.models.minicpmv4_6`. Importing
that module costs seconds, and a general plugin runs in every vLLM process (some never need the
model), so `register()` does not import it: it asks to be called back when vLLM imports it, and
the patches land before the importer gets the module back. If the module is already imported,
the callback runs at once.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]
_lock = threading.Lock()


class _Loader(importlib.abc.Loader):
    def __init__(self, loader: Any, callbacks: list[Callback]) -> None:
        self._loader = loader
        self._callbacks = callbacks

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        for callback in self._callbacks:
            callback(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, ...: the real loader's
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.pending: dict[str, list[Callback]] = {}

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, self.pending.pop(fullname))
        return spec


def _finder() -> _Finder:
    for finder in sys.meta_path:
        if isinstance(finder, _Finder):
            return finder
    finder = _Finder()
    sys.meta_path.insert(0, finder)
    return finder


def when_imported(name: str, callback: Callback) -> bool:
    """Call `callback(module)` once `name` is imported; True if it already was (ran now)."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _finder().pending.setdefault(name, []).append(callback)
            return False
    callback(module)
    return True
