"""How patches change vLLM: wrap a function once (now, or when vLLM imports its module), and log
through vLLM's logger."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .import_hook import when_imported
from .vllm_code import module_name, require_source

logger = logging.getLogger("vllm.minicpmv_ascend_plugin")
_held: list[str] = []


def emit(message: str) -> None:
    """Log at INFO through vLLM's logger, or hold the line until vLLM has set logging up.

    vLLM >= 0.32 configures its log handlers only after parsing the command line, and its API
    server loads general plugins while building that parser: a line logged then would vanish.
    Held lines go out, in order, with the next line this plugin logs once logging is set up.
    """
    if not logger.hasHandlers() or not logger.isEnabledFor(logging.INFO):
        _held.append(message)
        return
    while _held:
        logger.info("%s", _held.pop(0))
    logger.info("%s", message)


def wrap_once(owner: Any, attr: str, make: Callable[[Any], Any]) -> bool:
    """Replace `owner.attr` with `make(original)` unless this plugin already wrapped it.

    The wrapper is marked (`_minicpmv_ascend_plugin_wraps`), so a module that imported the
    wrapped function by name, or a second load of the plugin, is never wrapped twice.
    False when `owner` has no such attribute (another vLLM version's module layout).
    """
    original = getattr(owner, attr, None)
    if original is None:
        return False
    if getattr(original, "_minicpmv_ascend_plugin_wraps", None) is not None:
        return True
    wrapper = make(original)
    wrapper._minicpmv_ascend_plugin_wraps = original
    wrapper.__wrapped__ = original
    setattr(owner, attr, wrapper)
    return True


def wrap_when_imported(where: str | tuple[str, ...], attr: str, make: Callable[[Any], Any]) -> None:
    """`wrap_once` of `attr` (a function, or "Class.method") of a module as soon as it is imported (at
    once if it is): `where` is the module's name, or the vLLM source files it may be (vLLM moves
    modules between releases: the first that exists). Only the processes that import the module are
    changed, and none imports it earlier than vLLM would. A missing class is left alone, as
    `wrap_once` leaves a missing attribute (the predicate reports the layout)."""
    module_of = where if isinstance(where, str) else module_name(require_source(*where)[0])
    owner_path, _, name = attr.rpartition(".")

    def wrap(module: Any) -> None:
        owner = module
        for part in filter(None, owner_path.split(".")):
            owner = getattr(owner, part, None)
        if owner is not None:
            wrap_once(owner, name, make)

    when_imported(module_of, wrap)
