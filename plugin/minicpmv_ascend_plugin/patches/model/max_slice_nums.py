"""Backport: a per-request `max_slice_nums` is honoured when building image placeholders."""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
from types import ModuleType
from typing import Any

from ...core.patch import AT_MODEL_IMPORT, Patch

NAME = "max-slice-nums"
_REQUEST_MAX_SLICE_NUMS: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "minicpmv_ascend_plugin_max_slice_nums", default=None)


def check(module: ModuleType) -> str | None:
    processor = module.MiniCPMV4_6MultiModalProcessor
    if "max_slice_nums" in inspect.signature(processor.get_image_prompt_texts).parameters:
        return "vLLM passes a per-request max_slice_nums to the image placeholder (vLLM >= 0.32)"
    return None


def apply(module: ModuleType) -> None:
    processor_cls = module.MiniCPMV4_6MultiModalProcessor
    info_cls = module.MiniCPMV4_6ProcessingInfo
    original_updates = processor_cls._get_prompt_updates
    original_placeholder = info_cls.get_slice_image_placeholder

    def with_request_limit(replacement: Any, limit: int) -> Any:
        def replace(item_idx: int) -> Any:
            token = _REQUEST_MAX_SLICE_NUMS.set(limit)
            try:
                return replacement(item_idx)
            finally:
                _REQUEST_MAX_SLICE_NUMS.reset(token)
        return replace

    def _get_prompt_updates(self: Any, mm_items: Any, hf_processor_mm_kwargs: Any, *args: Any, **kwargs: Any) -> Any:
        updates = original_updates(self, mm_items, hf_processor_mm_kwargs, *args, **kwargs)
        limit = hf_processor_mm_kwargs.get("max_slice_nums")
        if limit is None:
            return updates
        return [
            dataclasses.replace(u, replacement=with_request_limit(u.replacement, int(limit)))
            if u.modality == "image" and callable(u.replacement) else u
            for u in updates
        ]

    def get_slice_image_placeholder(self: Any, image_size: Any, image_idx: int = 0,
                                    max_slice_nums: int | None = None, *args: Any, **kwargs: Any) -> Any:
        if max_slice_nums is None:
            max_slice_nums = _REQUEST_MAX_SLICE_NUMS.get()
        return original_placeholder(self, image_size, image_idx, max_slice_nums, *args, **kwargs)

    processor_cls._get_prompt_updates = _get_prompt_updates
    info_cls.get_slice_image_placeholder = get_slice_image_placeholder


PATCH = Patch(
    name=NAME,
    stage=AT_MODEL_IMPORT,
    summary="per-request mm_processor_kwargs max_slice_nums used for the image placeholders too",
    upstream="vLLM >= 0.32 minicpmv4_6.py (_resolve_max_slice_nums); absent in 0.25.1",
    check=check,
    apply=apply,
    fixes='per-request `max_slice_nums` cuts the image but the placeholders keep the default 9 (1084x820, 2: 441 vs 183)',
    tests='`test_per_request_max_slice_nums`, the sweep',
    delete_when='vLLM >= 0.32',
    details="""
wraps each image replacement of a request that sets `max_slice_nums` so
that `get_slice_image_placeholder` sees the value (a context variable), without rewriting vLLM's
closure. Only the flat key: it is what 0.23's `process_images` hands to the image processor.
Predicate: `get_image_prompt_texts` has no `max_slice_nums` parameter.
""",
    evidence={"0.30.0": ('applied', ('`minicpmv4_6.py:105-118`: `get_image_prompt_texts(image_size, image_idx, downsample_mode)` '
                         "has no `max_slice_nums`, while `:185` hands the request's kwargs to the image processor. "
                         '1084x820 with `max_slice_nums=2`: 441 placeholders for 183 embeddings without the plugin; '
                         'the sweep: 439 of 2,048 sizes wrong'))},
)
