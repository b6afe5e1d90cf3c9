"""An image of an extreme aspect ratio, or of more pixels than the server's limit, is a 400 first."""

from __future__ import annotations

import os
from typing import Any

from ...core.patch import AT_REGISTER, LayoutNotFound, Patch
from ...core.refusal import refuse
from ...core.vllm_code import require_source

NAME = "image-shape-400"
FUNCTIONS = ("fetch_image", "fetch_image_async")  # of MediaConnector: every image_url of a chat
IMAGE_LOADER = ("multimodal/media/image.py", "multimodal/image.py")  # 0.32, 0.23
ASPECT_ENV = "MAX_IMAGE_ASPECT_RATIO"
DEFAULT_ASPECT = 200  # the bound Qwen2-VL's processor enforces; a long screenshot or a panorama is far below it
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


def image_problem(image: Any) -> str | None:
    size = getattr(image, "size", None)
    return shape_problem(*size) if isinstance(size, tuple) and len(size) == 2 else None


def check(_: Any) -> str | None:
    from vllm.multimodal.media.connector import MediaConnector

    missing = [n for n in FUNCTIONS if not hasattr(MediaConnector, n)]
    if missing:
        raise LayoutNotFound(f"vLLM's MediaConnector has no {', '.join(missing)}")
    _, source = require_source(*IMAGE_LOADER)
    if "aspect" in source.lower():
        return "vLLM's image loader bounds the aspect ratio itself"
    return None


def apply(_: Any) -> None:
    from vllm.multimodal.media.connector import MediaConnector

    for function in FUNCTIONS:
        refuse(MediaConnector, function, after=image_problem)


PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary=f"an image past {ASPECT_ENV} ({DEFAULT_ASPECT}:1) or {PIXELS_ENV}: 400 before the processor "
            "slices it",
    upstream=f"none: no vLLM setting bounds an image's aspect ratio (0.23-0.33); {PIXELS_ENV} from 0.30",
    check=check,
    apply=apply,
    fixes=("no bound on an image's aspect ratio: a 100000x1 PNG (a few hundred bytes) costs 13-53 s of processing and is "
           "served; vLLM 0.23 has no pixel bound besides Pillow's 2x bomb limit"),
    tests=("`plugin/tests/patches/test_server_patches.py::test_media_loader_refusals_are_400s` (each target's connector: 400 with, "
           "served without); row of `tests/test_bad_requests.py` (400 on 0.32's server)"),
    delete_when='vLLM bounds the aspect ratio (and the pixel count on the oldest target kept)',
    details=f"""
wraps `MediaConnector.{FUNCTIONS[0]}` and `{FUNCTIONS[1]}` (every image of a chat: data:, http(s),
file://): the loaded image's longer side / shorter side at most `{ASPECT_ENV}` ({DEFAULT_ASPECT}, the
launcher's `max_image_aspect_ratio`; Qwen2-VL's processor enforces the same bound) and width x height
at most `{PIXELS_ENV}` ({DEFAULT_PIXELS}: vLLM's variable and default, applied on 0.23 too, where
vLLM lacks it); past either a `ValueError` (400) saying what to change, before the processor slices
the image (MiniCPM-V's processor turns a 100000x1 PNG into 13-53 s of work, docs/reliability.md).
Predicate: the connector has both methods and vLLM's image loader source (`{IMAGE_LOADER[0]}`)
says nothing of an aspect ratio.
""",
    evidence={"0.30.0": ('applied', (f'`{IMAGE_LOADER[0]}:79-94`: `load_bytes` bounds the pixel count '
                                     f'(`{PIXELS_ENV}`) but not the aspect ratio; `multimodal/media/connector.py` '
                                     f'`{FUNCTIONS[0]}` / `{FUNCTIONS[1]}` hand any shape to the processor'))},
)
