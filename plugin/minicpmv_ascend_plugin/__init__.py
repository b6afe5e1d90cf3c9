"""vLLM general plugin for MiniCPM-V 4.6 (Thinking) on vLLM + vllm-ascend.

Registered under the `vllm.general_plugins` entry point, so vLLM calls `register()` in every one
of its processes (API server, engine core, workers). Each patch is a module under `patches/`
(grouped by what it fixes: `api` requests and responses, `media` loading, `model` code, server
`lifecycle`) whose `PATCH` record holds its predicate (feature detection first, version second),
its change and every word plugin/README.md says about it; on a vLLM that has the fix, nothing is
applied. `core/` holds the registry (`core/registry.py`) and what the patches share.

Environment:
  MINICPMV_ASCEND_PLUGIN=off                  register nothing (the plugin stays installed)
  MINICPMV_ASCEND_PLUGIN=off:NAME[,NAME...]   everything but the named patches (an A/B or a
                                              numerical check with one patch off); an unknown
                                              name stops vLLM with the list of names
  MINICPMV_ASCEND_PLUGIN_FORCE=rotary-mrope   apply the Ascend RoPE config on any platform
  MINICPMV_ASCEND_PLUGIN_SHM_BUSY_SLEEP_S=SECONDS
                                              vLLM's message-queue readers sleep between checks in
                                              their busy window (shm-busy-sleep; unset: vLLM's loop)
"""
from __future__ import annotations

from .core.registry import (
    LAYOUT_NOT_FOUND,
    PATCH_MODULES,
    PATCHES,
    decisions,
    disabled,
    register,
    report,
    switched_off,
)
from .core.registry import __version__ as __version__
from .core.vllm_code import ascend_device_type, dist_version, platform_name, vllm_version

# The public API. The plugin's patches and decisions, and what it reads of the installation (the
# checks its predicates rest on): scripts/ascend_check.py and the launcher use these names only.
__all__ = ["PATCHES", "PATCH_MODULES", "LAYOUT_NOT_FOUND", "register", "report", "decisions", "disabled", "switched_off",
           "platform_name", "ascend_device_type", "vllm_version", "dist_version"]
