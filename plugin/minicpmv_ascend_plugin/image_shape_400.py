"""An image of an extreme aspect ratio, or of more pixels than the server's limit, is a 400 before
any processing work, on every target.

Gap (vLLM 0.23, 0.30 and 0.32): no setting bounds an image's aspect ratio, and MiniCPM-V's
processor turns a 100000x1 PNG (a few hundred bytes on the wire) into 13-53 s of work
(docs/reliability.md). The pixel count is bounded by `VLLM_MAX_IMAGE_PIXELS` in 0.30 and 0.32
(`ImageMediaIO.load_bytes`), and by nothing but Pillow's decompression-bomb guard (2 x
178,956,970 pixels) in 0.23.

Fix: `MediaConnector.fetch_image` and `fetch_image_async` (every image_url of a chat, data:, http(s)
and file:// alike) check the loaded image's size before it is handed on to the processor: longer
side / shorter side at most MAX_IMAGE_ASPECT_RATIO (200, the bound Qwen2-VL's processor enforces;
a long screenshot or a panorama is far below it), and width x height at most
VLLM_MAX_IMAGE_PIXELS (vLLM's variable and default, 178,956,970, also where vLLM lacks it). Past
either: ValueError (400) saying what to change.

Applies when: vLLM's `MediaConnector` has `fetch_image` and `fetch_image_async` and its image
loader (`multimodal/media/image.py`) has no aspect-ratio bound.
Delete when: vLLM bounds the aspect ratio (and the pixel count on the oldest target kept).
"""

from __future__ import annotations

import functools
import os
from typing import Any

from ._base import AT_REGISTER, LayoutNotFound, Patch, require_source, wrap_once

NAME = "image-shape-400"
ASPECT_ENV = "MAX_IMAGE_ASPECT_RATIO"
DEFAULT_ASPECT = 200
PIXELS_ENV = "VLLM_MAX_IMAGE_PIXELS"
DEFAULT_PIXELS = 178_956_970  # vLLM's default (Pillow's MAX_IMAGE_PIXELS)


def _limit(env: str, default: int) -> int:
    value = os.environ.get(env, "").strip()
    return int(value) if value.isdigit() else default


def shape_problem(width: int, height: int) -> str | None:
    """Why an image of this size is refused (None: it is not)."""
    aspect, pixels = _limit(ASPECT_ENV, DEFAULT_ASPECT), _limit(PIXELS_ENV, DEFAULT_PIXELS)
    if width <= 0 or height <= 0:
        return None
    if aspect > 0 and max(width, height) > aspect * min(width, height):
        return (f"the image is {width}x{height}: its aspect ratio ({max(width, height) / min(width, height):.0f}:1) "
                f"exceeds this server's limit of {aspect}:1 ({ASPECT_ENV}); crop or pad the image, or send "
                f"it in parts")
    if pixels > 0 and width * height > pixels:
        return (f"the image is {width}x{height} ({width * height} pixels), more than this server's limit of "
                f"{pixels} pixels ({PIXELS_ENV}); downscale it and send it again")
    return None


def _check(image: Any) -> Any:
    size = getattr(image, "size", None)
    if isinstance(size, tuple) and len(size) == 2:
        problem = shape_problem(*size)
        if problem:
            raise ValueError(problem)
    return image


def _fetch_image(original: Any) -> Any:
    @functools.wraps(original)
    def fetch(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _check(original(self, *args, **kwargs))

    return fetch


def _fetch_image_async(original: Any) -> Any:
    @functools.wraps(original)
    async def fetch(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _check(await original(self, *args, **kwargs))

    return fetch


def check(_: Any) -> str | None:
    from vllm.multimodal.media.connector import MediaConnector

    missing = [n for n in ("fetch_image", "fetch_image_async") if not hasattr(MediaConnector, n)]
    if missing:
        raise LayoutNotFound(f"vLLM's MediaConnector has no {', '.join(missing)}")
    _, source = require_source("multimodal/media/image.py", "multimodal/image.py")
    if "aspect" in source.lower():
        return "vLLM's image loader bounds the aspect ratio itself"
    return None


def apply(_: Any) -> None:
    from vllm.multimodal.media.connector import MediaConnector

    wrap_once(MediaConnector, "fetch_image", _fetch_image)
    wrap_once(MediaConnector, "fetch_image_async", _fetch_image_async)


# plugin/README.md's "Details and evidence" for this patch (Markdown; scripts/patch_table.py renders it).
DETAILS = r"""
wraps `MediaConnector.fetch_image` and `fetch_image_async` (every image of a
chat: data:, http(s), file://): the loaded image's longer side / shorter side at most
`MAX_IMAGE_ASPECT_RATIO` (200, the launcher's `max_image_aspect_ratio`; Qwen2-VL's processor
enforces the same bound) and width x height at most `VLLM_MAX_IMAGE_PIXELS` (vLLM's variable and
default, applied on 0.23 too, where vLLM lacks it); past either a `ValueError` (400) saying what
to change, before the processor slices the image. Predicate: the connector has both methods and
vLLM's image loader source says nothing of an aspect ratio.
"""

PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary="an image past MAX_IMAGE_ASPECT_RATIO (200:1) or VLLM_MAX_IMAGE_PIXELS: 400 before the processor "
            "slices it",
    upstream="none: no vLLM setting bounds an image's aspect ratio (0.23-0.33); VLLM_MAX_IMAGE_PIXELS from 0.30",
    check=check,
    apply=apply,
    fixes=("no bound on an image's aspect ratio: a 100000x1 PNG (a few hundred bytes) costs 13-53 s of processing and is "
     "served; vLLM 0.23 has no pixel bound besides Pillow's 2x bomb limit"),
    references='none (0.23 - 0.33; `VLLM_MAX_IMAGE_PIXELS` from 0.30)',
    tests=("`plugin/tests/test_server_patches.py::test_media_loader_refusals_are_400s` (each target's connector: 400 with, "
     "served without); row of `tests/test_bad_requests.py` (400 on 0.32's server)"),
    delete_when='vLLM bounds the aspect ratio',
    details=DETAILS,
    evidence={"0.30.0": ('applied', ('`multimodal/media/image.py:79-94`: `load_bytes` bounds the pixel count '
                         '(`VLLM_MAX_IMAGE_PIXELS`) but not the aspect ratio; `multimodal/media/connector.py` '
                         '`fetch_image` / `fetch_image_async` hand any shape to the processor'))},
)
