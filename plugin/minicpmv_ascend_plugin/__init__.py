"""vLLM general plugin for MiniCPM-V 4.6 (Thinking) on vLLM + vllm-ascend.

Registered under the `vllm.general_plugins` entry point, so vLLM calls `register()` in every one
of its processes (API server, engine core, workers). Each patch is a module here with the
upstream reference, a predicate (feature detection first, version second) and the change; on a
vLLM that has the fix, nothing is applied. plugin/README.md lists them and when to delete each.

`register()` is cheap (it imports no vLLM model code) and idempotent. It checks the transformers
requirement (and stops vLLM without a usable one), decides the parser registration and the config
hooks (which vLLM picks up when it imports its config map), and defers the model backports to the
moment vLLM imports its MiniCPM-V 4.6 module (that import costs seconds; not every process needs
it). It logs one line; the deferred backports log one more when they are decided.

Environment:
  MINICPMV_ASCEND_PLUGIN=off                  register nothing (the plugin stays installed)
  MINICPMV_ASCEND_PLUGIN=off:NAME[,NAME...]   everything but the named patches (an A/B or a
                                              numerical check with one patch off); an unknown
                                              name stops vLLM with the list of names
  MINICPMV_ASCEND_PLUGIN_FORCE=rotary-mrope   apply the Ascend RoPE config on any platform
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from types import ModuleType
from typing import Any

from . import (
    content_part_400,
    data_url_400,
    engine_death_exit,
    file_url_400,
    gdn_one_token_prefill,
    gdn_state_dtype,
    image_bomb_400,
    image_shape_400,
    image_size_order,
    json_whitespace,
    max_slice_nums,
    processor_version,
    public_media_urls,
    reasoning,
    request_type_400,
    responses_assistant_content,
    rotary_mrope,
    shutdown_cut_requests,
    shutdown_drain_503,
    transformers_check,
    uvicorn_signals,
    vit_merger_flags,
    vit_varlen_attention,
)
from ._base import (
    AT_MODEL_IMPORT,
    AT_REGISTER,
    MODEL_MODULE,
    Patch,
    ascend_device_type,
    dist_version,
    emit,
    platform_name,
    vllm_version,
)
from ._import_hook import when_imported

__version__ = "0.1.0"
# The public API. The plugin's patches and decisions, and what it reads of the installation (the
# checks its predicates rest on): scripts/ascend_check.py and the launcher use these names only.
__all__ = ["PATCHES", "register", "report", "decisions", "disabled", "switched_off",
           "platform_name", "ascend_device_type", "vllm_version", "dist_version"]

DISABLE_ENV = "MINICPMV_ASCEND_PLUGIN"
LOG_PREFIX = "minicpmv_ascend_plugin"
PATCHES: tuple[Patch, ...] = (
    reasoning.PATCH,
    gdn_state_dtype.PATCH,
    rotary_mrope.PATCH,
    processor_version.PATCH,
    image_size_order.PATCH,
    vit_merger_flags.PATCH,
    vit_varlen_attention.PATCH,
    max_slice_nums.PATCH,
    engine_death_exit.PATCH,
    shutdown_cut_requests.PATCH,
    file_url_400.PATCH,
    data_url_400.PATCH,
    gdn_one_token_prefill.PATCH,
    image_bomb_400.PATCH,
    image_shape_400.PATCH,
    uvicorn_signals.PATCH,
    shutdown_drain_503.PATCH,
    request_type_400.PATCH,
    content_part_400.PATCH,
    responses_assistant_content.PATCH,
    public_media_urls.PATCH,
    json_whitespace.PATCH,
)
logger = logging.getLogger("vllm.minicpmv_ascend_plugin")  # errors only; INFO goes through emit()


@dataclasses.dataclass(frozen=True)
class Decision:
    status: str  # "applied", "skipped" or "pending" (model backports before vLLM imports the model)
    reason: str = ""


_decisions: dict[str, Decision] = {}
_lock = threading.RLock()
_registered = False


def decisions() -> dict[str, Decision]:
    """What this process decided so far, by patch name."""
    with _lock:
        return dict(_decisions)


def _decide(patch: Patch, target: Any) -> Decision:
    with _lock:
        done = _decisions.get(patch.name)
        if done is not None and done.status != "pending":
            return done
        marks = getattr(target, "_minicpmv_ascend_plugin_applied", None) if target is not None else None
        if patch.name in switched_off():
            decision = Decision("skipped", f"switched off by {DISABLE_ENV}={os.environ.get(DISABLE_ENV, '').strip()}")
        elif marks is not None and patch.name in marks:  # the module was patched by an earlier load
            decision = Decision("applied", marks[patch.name])
        else:
            try:
                reason = patch.check(target)
            except Exception as error:  # noqa: BLE001 - an unreadable predicate must not stop vLLM
                reason = f"predicate failed, not applied: {type(error).__name__}: {error}"
            if reason is None:
                patch.apply(target)  # a failure here is a plugin bug: let it surface
                decision = Decision("applied", patch.summary)
                if target is not None:
                    marks = getattr(target, "_minicpmv_ascend_plugin_applied", None)
                    if marks is None:
                        marks = {}
                        target._minicpmv_ascend_plugin_applied = marks
                    marks[patch.name] = patch.summary
            else:
                decision = Decision("skipped", reason)
        _decisions[patch.name] = decision
        return decision


def _summary(names: list[str]) -> str:
    applied = [n for n in names if _decisions[n].status == "applied"]
    skipped = [f"{n} ({_decisions[n].reason})" for n in names if _decisions[n].status == "skipped"]
    pending = [n for n in names if _decisions[n].status == "pending"]
    parts = [f"applied: {', '.join(applied) or 'none'}", f"skipped: {', '.join(skipped) or 'none'}"]
    if pending:
        parts.append(f"decided when vLLM imports {MODEL_MODULE.rsplit('.', 1)[-1]}: {', '.join(pending)}")
    return "; ".join(parts)


def _on_model_import(module: ModuleType) -> None:
    names = [p.name for p in PATCHES if p.stage == AT_MODEL_IMPORT]
    with _lock:
        for patch in PATCHES:
            if patch.stage == AT_MODEL_IMPORT:
                _decide(patch, module)
        line = _summary(names)
    emit(f"{LOG_PREFIX}: {MODEL_MODULE.rsplit('.', 1)[-1]} imported (vLLM {vllm_version()}): {line}")


OFF_WORDS = ("0", "off", "false", "no", "disabled")


def disabled() -> bool:
    """The whole plugin is off (`MINICPMV_ASCEND_PLUGIN=off`)."""
    return os.environ.get(DISABLE_ENV, "").strip().lower() in OFF_WORDS


def switched_off() -> frozenset[str]:
    """The patches `MINICPMV_ASCEND_PLUGIN=off:NAME,NAME` switches off (the rest stays on)."""
    head, colon, names = os.environ.get(DISABLE_ENV, "").partition(":")
    if not colon or head.strip().lower() not in OFF_WORDS:
        return frozenset()
    return frozenset(n.strip() for n in names.split(",") if n.strip())


def _switch_problem() -> str | None:
    unknown = sorted(switched_off() - {p.name for p in PATCHES})
    if not unknown:
        return None
    return (f"{DISABLE_ENV}={os.environ.get(DISABLE_ENV, '').strip()} names no patch of this plugin: "
            f"{', '.join(unknown)}; the patches are {', '.join(p.name for p in PATCHES)}")


def register() -> None:
    """vLLM's entry point: check the requirement, apply what applies, log one line."""
    global _registered
    with _lock:
        if _registered:
            return
        if disabled():
            _registered = True
            emit(f"{LOG_PREFIX} {__version__}: disabled by {DISABLE_ENV}")
            return
        vllm = vllm_version()
        problem = _switch_problem() or transformers_check.current_problem(vllm)
        if problem:
            logger.error("%s: %s", LOG_PREFIX, problem)
            raise RuntimeError(f"{LOG_PREFIX}: {problem}")
        _registered = True
        for patch in PATCHES:
            if patch.stage == AT_REGISTER:
                _decide(patch, None)
            else:
                _decisions.setdefault(patch.name, Decision("pending"))
        line = _summary([p.name for p in PATCHES])
        emit(f"{LOG_PREFIX} {__version__} (vLLM {vllm}, transformers {dist_version('transformers')}, "
             f"platform {platform_name()}): {line}")
    when_imported(MODEL_MODULE, _on_model_import)


def report(import_model: bool = True) -> list[dict[str, str]]:
    """Every patch with its decision in this process (for scripts/ascend_check.py).

    With `import_model`, vLLM's MiniCPM-V 4.6 module is imported so the model backports are
    decided too (as they would be in a serving process).
    """
    register()
    if import_model and not disabled():
        import importlib

        importlib.import_module(MODEL_MODULE)
    current = decisions()
    return [
        {
            "name": p.name,
            "stage": p.stage,
            "status": current.get(p.name, Decision("skipped", "plugin disabled")).status,
            "reason": current.get(p.name, Decision("skipped", "plugin disabled")).reason,
            "summary": p.summary,
            "upstream": p.upstream,
        }
        for p in PATCHES
    ]
