"""One `MODELS_CONFIG_MAP` entry per MiniCPM-V architecture (4.6, 4.7) that runs this plugin's
config fixes.

vLLM calls `MODELS_CONFIG_MAP[architecture].verify_and_update_config(vllm_config)` once, first
thing in `VllmConfig.__post_init__`, in the process that builds the configuration (the API
server, or the `vllm.LLM` process), before the engine core and the workers receive that
configuration and before any layer is built: a fix made to the config there reaches every process.

The entry is installed when vLLM imports `vllm.model_executor.models.config` (at once if it
already has): importing it from `register()` would pull in vLLM's whole model package while vLLM
is still building its command-line parser, earlier than vLLM itself does. If vLLM (or another
plugin) has an entry for the architecture, it keeps running first.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from .import_hook import when_imported
from .patch import LayoutNotFound
from .vllm_code import package_dir

# The architectures of minicpmv_ascend.common.models (the plugin does not import the kit:
# tests/test_minicpmv47.py keeps the two equal). 4.7 subclasses 4.6 in vLLM; its config, too, passes
# through the hooks (each hook decides whether a config needs it).
ARCHITECTURES = ("MiniCPMV4_6ForConditionalGeneration", "MiniCPMV4_7ForConditionalGeneration")
CONFIG_MODULE = "vllm.model_executor.models.config"
_MARK = "_minicpmv_ascend_plugin_hooks"
_wanted: dict[str, Callable[[Any], None]] = {}


def upstream_has_entry() -> bool:
    """Whether vLLM maps a MiniCPM-V architecture to a config hook of its own (none up to 0.33).

    Read from the loaded map if vLLM has imported it, else from its source (without importing);
    `LayoutNotFound` when that source holds no `MODELS_CONFIG_MAP` (the map moved: this plugin's
    entry would not be installed either).
    """
    module = sys.modules.get(CONFIG_MODULE)
    if module is not None:
        for architecture in ARCHITECTURES:
            entry = module.MODELS_CONFIG_MAP.get(architecture)
            if entry is not None and getattr(entry, _MARK, None) is not None:
                entry = getattr(entry, "_minicpmv_ascend_plugin_previous", None)
            if entry is not None:
                return True
        return False
    root = package_dir("vllm")
    try:
        source = (root / "model_executor" / "models" / "config.py").read_text(encoding="utf-8") if root else ""
    except OSError:
        source = ""
    if "MODELS_CONFIG_MAP" not in source:
        raise LayoutNotFound("vLLM's model_executor/models/config.py has no MODELS_CONFIG_MAP")
    return any(f'"{architecture}"' in source for architecture in ARCHITECTURES)


def _install(module: Any) -> None:
    for architecture in ARCHITECTURES:
        _install_one(module, architecture)


def _install_one(module: Any, architecture: str) -> None:
    entry = module.MODELS_CONFIG_MAP.get(architecture)
    hooks: dict[str, Callable[[Any], None]] | None = getattr(entry, _MARK, None) if entry else None
    if hooks is None:
        previous = entry
        hooks = {}

        class MiniCPMVPluginConfig(module.VerifyAndUpdateConfig):  # type: ignore[name-defined, misc]
            _minicpmv_ascend_plugin_previous = previous

            @staticmethod
            def verify_and_update_config(vllm_config: Any) -> None:
                if previous is not None:
                    previous.verify_and_update_config(vllm_config)
                for run in list(hooks.values()):
                    run(vllm_config)

            @staticmethod
            def verify_and_update_model_config(model_config: Any) -> None:
                if previous is not None and hasattr(previous, "verify_and_update_model_config"):
                    previous.verify_and_update_model_config(model_config)

        setattr(MiniCPMVPluginConfig, _MARK, hooks)
        module.MODELS_CONFIG_MAP[architecture] = MiniCPMVPluginConfig
    hooks.update(_wanted)


def add(name: str, hook: Callable[[Any], None]) -> None:
    """Run `hook(vllm_config)` for MiniCPM-V configurations (every architecture); idempotent per name."""
    _wanted[name] = hook
    when_imported(CONFIG_MODULE, _install)
