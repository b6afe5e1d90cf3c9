"""The registry: every patch in the order it is decided, what this process decided, and
`register()`, which vLLM calls in each of its processes (the package's `__init__` exports it).

`register()` is cheap (it imports no vLLM model code) and idempotent. It checks the transformers
requirement (and stops vLLM without a usable one), decides the patches of stage AT_REGISTER, and
defers the model backports (AT_MODEL_IMPORT) to the moment vLLM imports its MiniCPM-V 4.6 module
(that import costs seconds; not every process needs it). It logs one line; the deferred backports
log one more when they are decided.
"""


from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import threading
from types import ModuleType
from typing import Any

from . import transformers_check
from .import_hook import when_imported
from .patch import AT_MODEL_IMPORT, AT_REGISTER, MODEL_MODULE, LayoutNotFound, Patch
from .vllm_code import dist_version, platform_name, vllm_version
from .wrap import emit

PACKAGE = __name__.rsplit(".", 2)[0]  # minicpmv_ascend_plugin
__version__ = "0.1.0"
DISABLE_ENV = "MINICPMV_ASCEND_PLUGIN"
LOG_PREFIX = "minicpmv_ascend_plugin"
# The patches, in the order they are decided: the order of the log lines, the patch table and
# `entrypoint.py --dry-run`. A new patch is one module under patches/ (with its `PATCH`) and one
# dotted name in this list (and its line per target in plugin/tests/_target.py NEEDED); tests check
# that every module holding a `PATCH` is listed.
PATCH_MODULES: tuple[str, ...] = (
    "patches.api.reasoning",
    "patches.model.gdn_state_dtype",
    "patches.model.rotary_mrope",
    "patches.model.processor_version",
    "patches.model.image_size_order",
    "patches.model.vit_merger_flags",
    "patches.model.vit_varlen_attention",
    "patches.model.max_slice_nums",
    "patches.lifecycle.engine_death_exit",
    "patches.lifecycle.shutdown_cut_requests",
    "patches.media.file_url_400",
    "patches.media.data_url_400",
    "patches.model.gdn_one_token_prefill",
    "patches.media.image_bomb_400",
    "patches.media.image_shape_400",
    "patches.lifecycle.uvicorn_signals",
    "patches.lifecycle.shutdown_drain_503",
    "patches.api.request_type_400",
    "patches.api.content_part_400",
    "patches.api.responses_assistant_content",
    "patches.media.public_media_urls",
    "patches.api.json_whitespace",
    "patches.api.allowed_token_ids_rows",
    "patches.lifecycle.shm_busy_sleep",
)
PATCHES: tuple[Patch, ...] = tuple(importlib.import_module(f"{PACKAGE}.{name}").PATCH for name in PATCH_MODULES)
logger = logging.getLogger("vllm.minicpmv_ascend_plugin")  # errors only; INFO goes through emit()


@dataclasses.dataclass(frozen=True)
class Decision:
    # "applied", "skipped", LAYOUT_NOT_FOUND (the predicate could not find the vLLM code it reads:
    # not applied, logged as a WARNING) or "pending" (model backports before vLLM imports the model)
    status: str
    reason: str = ""


# A predicate's third outcome (it raised `LayoutNotFound`, or vLLM's module or class it reads is
# missing: ImportError / AttributeError). Not a refusal to start: the plugin cannot tell a vLLM that
# moved buggy code from one that fixed the bug upstream and rewrote the code on the way, and an
# operator on a newer vLLM that fixed it must still be able to serve. So the patch stays unapplied,
# the server logs a WARNING naming it, plugin/tests fail on it for every target, and
# `make patch-check VLLM=...` fails on it for a new release (plugin/README.md, "A new vLLM release").
LAYOUT_NOT_FOUND = "layout-not-found"


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
            layout = None
            try:
                reason = patch.check(target)
            except LayoutNotFound as error:
                reason = layout = str(error)
            except (ImportError, AttributeError) as error:  # a module or class of vLLM it reads is gone
                reason = layout = f"{type(error).__name__}: {error}"
            except Exception as error:  # noqa: BLE001 - an unreadable predicate must not stop vLLM
                reason = f"predicate failed, not applied: {type(error).__name__}: {error}"
            if layout is not None:
                logger.warning("%s: %s not applied: layout not found: %s (this vLLM's code is not where the "
                               "patch's predicate looks; see plugin/README.md, \"A new vLLM release\")",
                               LOG_PREFIX, patch.name, layout)
                decision = Decision(LAYOUT_NOT_FOUND, layout)
            elif reason is None:
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
    unfound = [f"{n} ({_decisions[n].reason})" for n in names if _decisions[n].status == LAYOUT_NOT_FOUND]
    parts = [f"applied: {', '.join(applied) or 'none'}", f"skipped: {', '.join(skipped) or 'none'}"]
    if unfound:
        parts.append(f"layout not found: {', '.join(unfound)}")
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
