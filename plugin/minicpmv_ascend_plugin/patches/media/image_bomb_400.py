"""An image too large to decode (Pillow's decompression-bomb guard) is a 400, not a 500."""

from __future__ import annotations

from typing import Any

from ...core.patch import AT_REGISTER, Patch
from ...core.refusal import decide, raised_by, refuse

NAME = "image-bomb-400"
OWNER = "ImageMediaIO"
FUNCTION = "load_bytes"  # every image path goes through it: data: URLs, http(s), file://
BOMB_SIDE = 14_000  # a 1x1 PNG whose header says BOMB_SIDE x BOMB_SIDE: above Pillow's limit, refused on open


def message(error: BaseException) -> str:
    from PIL import Image

    limit = 2 * Image.MAX_IMAGE_PIXELS if Image.MAX_IMAGE_PIXELS else "fewer"
    return f"Failed to load image: {error} Downscale the image to at most {limit} pixels and send it again."


def bomb_png(width: int = BOMB_SIDE, height: int = BOMB_SIDE) -> bytes:
    """A 1x1 PNG whose header claims width x height (Pillow refuses it on open, before decoding)."""
    import io
    import struct
    import zlib

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (1, 1)).save(buffer, "PNG")
    data = bytearray(buffer.getvalue())
    header = struct.pack(">II", width, height) + bytes(data[24:29])
    data[16:29] = header
    data[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + header) & 0xFFFFFFFF)
    return bytes(data)


def probe() -> BaseException | None:
    """What vLLM's own loader raises for the bomb (None: nothing)."""
    from vllm.multimodal.media.image import ImageMediaIO

    return raised_by(ImageMediaIO, FUNCTION, lambda load: load(ImageMediaIO(), bomb_png()))


def check(_: Any) -> str | None:
    from PIL import Image
    from vllm.multimodal.media.image import ImageMediaIO

    if not Image.MAX_IMAGE_PIXELS:
        return "Pillow's decompression-bomb limit is off (PIL.Image.MAX_IMAGE_PIXELS is None)"
    # NotImplementedError too: the call reaches an abstract base (ImageMediaIO lost load_bytes)
    return decide(probe(), ImageMediaIO, FUNCTION, Image.DecompressionBombError, "a decompression bomb",
                  unprobeable=(TypeError, AttributeError, NotImplementedError))


def apply(_: Any) -> None:
    from PIL import Image
    from vllm.multimodal.media.image import ImageMediaIO

    refuse(ImageMediaIO, FUNCTION, catch=(Image.DecompressionBombError, message))


PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary="an image above Pillow's pixel limit (decompression bomb): 400 (ValueError) instead of 500",
    upstream=f"vllm/multimodal/media/image.py {OWNER}.{FUNCTION} lets DecompressionBombError through (0.23-0.32)",
    check=check,
    apply=apply,
    fixes=("an image whose header claims more than Pillow's limit (178,956,970 pixels; a 411-byte PNG that says "
           f"{BOMB_SIDE}x{BOMB_SIDE}) gets **500** (`DecompressionBombError`) instead of 400"),
    tests=(f"`test_media_loader_refusals_are_400s` (the target's `{OWNER}` + `create_error_response`: 400, 500 "
           "without); row 40 of `tests/test_bad_requests.py` (400 on 0.32's server)"),
    delete_when=f'`{OWNER}.{FUNCTION}` raises a 4xx error for it',
    details=f"""
Pillow's `Image.open` raises `DecompressionBombError` (an `Exception`, not an `OSError`) from the
header, before decoding, above 2 x `PIL.Image.MAX_IMAGE_PIXELS`. vLLM's `{OWNER}.{FUNCTION}` (0.23,
0.30 and 0.32, `vllm/multimodal/media/image.py`; every image path goes through it: data: URLs,
http(s), file://) maps only `OSError` / `UnidentifiedImageError` to `ValueError`, so the bomb became
500 (vLLM 0.32's `VLLM_MAX_IMAGE_PIXELS` check comes after `Image.open` and never sees it). The
patch wraps `{FUNCTION}` and raises `ValueError` ("Failed to load image: <Pillow's message>
Downscale the image to at most 178956970 pixels and send it again."), which all three map to 400.
Predicate: vLLM's own `{FUNCTION}`, given a 1x1 PNG whose header says {BOMB_SIDE}x{BOMB_SIDE}, raises
`DecompressionBombError`.
""",
    evidence={"0.30.0": ('applied', (f'`multimodal/media/image.py:79-94`: `{FUNCTION}` maps only `OSError` / '
                                     '`UnidentifiedImageError` to `ValueError`; its `VLLM_MAX_IMAGE_PIXELS` check '
                                     '(:83-89) comes after `Image.open`, which raises `DecompressionBombError` (500 '
                                     'without the plugin)'))},
)
