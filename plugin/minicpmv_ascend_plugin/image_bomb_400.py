"""An image too large to decode (Pillow's decompression-bomb guard) is a 400, not a 500.

Bug (vLLM 0.23, 0.30 and 0.32, `vllm/multimodal/media/image.py`): `ImageMediaIO.load_bytes` opens the
image with Pillow and turns `OSError` / `UnidentifiedImageError` into `ValueError("Failed to load
image: ...")` (400). An image whose header claims more than Pillow's limit (2 x
`PIL.Image.MAX_IMAGE_PIXELS` = 178,956,970 pixels, e.g. a 411-byte PNG that says 14000x14000)
makes `Image.open` raise `PIL.Image.DecompressionBombError`, which is neither: it reaches vLLM's
`create_error_response` as an unknown exception and the client gets 500 InternalServerError for
its own oversized image. (vLLM 0.32's `VLLM_MAX_IMAGE_PIXELS` check comes after `Image.open`, so
it never sees these.) No upstream fix (0.23, 0.30, 0.32).

Fix: the same refusal as `ValueError` (400 BadRequestError on 0.23, 0.30 and 0.32), with Pillow's
reason and what to do: "Failed to load image: Image size (196000000 pixels) exceeds limit of
178956970 pixels, could be decompression bomb DOS attack. Downscale the image to at most
178956970 pixels and send it again." Every image path (data: URL, http(s), file://) goes through
`load_bytes`.

Applies when: vLLM's own `ImageMediaIO().load_bytes`, given a PNG whose header claims more pixels
than Pillow's limit, raises `DecompressionBombError` instead of `ValueError`.
Delete when: it raises `ValueError` (or another 4xx error) upstream.
"""

from __future__ import annotations

import functools
from typing import Any

from ._base import AT_REGISTER, LayoutNotFound, Patch, wrap_once

NAME = "image-bomb-400"


def _load_bytes(original: Any) -> Any:
    @functools.wraps(original)
    def load_bytes(self: Any, data: bytes) -> Any:
        from PIL import Image

        try:
            return original(self, data)
        except Image.DecompressionBombError as error:
            limit = 2 * Image.MAX_IMAGE_PIXELS if Image.MAX_IMAGE_PIXELS else "fewer"
            raise ValueError(f"Failed to load image: {error} Downscale the image to at most {limit} pixels "
                             "and send it again.") from error

    return load_bytes


def bomb_png(width: int = 14_000, height: int = 14_000) -> bytes:
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
    """What vLLM's own `ImageMediaIO.load_bytes` raises for a decompression bomb (None: nothing)."""
    from vllm.multimodal.media.image import ImageMediaIO

    loader = ImageMediaIO.load_bytes
    loader = getattr(loader, "_minicpmv_ascend_plugin_wraps", loader)  # vLLM's, not ours
    try:
        loader(ImageMediaIO(), bomb_png())
    except Exception as error:  # noqa: BLE001 - the exception type is what is probed
        return error
    return None


def check(_: Any) -> str | None:
    from PIL import Image

    if not Image.MAX_IMAGE_PIXELS:
        return "Pillow's decompression-bomb limit is off (PIL.Image.MAX_IMAGE_PIXELS is None)"
    error = probe()
    # the call no longer fits vLLM's loader, or reaches an abstract base (ImageMediaIO lost load_bytes)
    if isinstance(error, (TypeError, AttributeError, NotImplementedError)):
        raise LayoutNotFound(f"vLLM's ImageMediaIO.load_bytes cannot be probed: {type(error).__name__}: {error}")
    if isinstance(error, ValueError) or not isinstance(error, Image.DecompressionBombError):
        return f"vLLM refuses a decompression bomb with {type(error).__name__}, not DecompressionBombError"
    return None


def apply(_: Any) -> None:
    from vllm.multimodal.media.image import ImageMediaIO

    wrap_once(ImageMediaIO, "load_bytes", _load_bytes)


# plugin/README.md's "Details and evidence" for this patch (Markdown; scripts/patch_table.py renders it).
DETAILS = r"""
Pillow's `Image.open` raises `DecompressionBombError` (an `Exception`, not
an `OSError`) from the header, before decoding, above 2 x `PIL.Image.MAX_IMAGE_PIXELS`. vLLM's
`ImageMediaIO.load_bytes` (0.23, 0.30 and 0.32, `vllm/multimodal/media/image.py`; every image
path goes through it: data: URLs, http(s), file://) maps only `OSError` / `UnidentifiedImageError` to
`ValueError`, so the bomb became 500. The patch wraps `load_bytes` and raises `ValueError`
("Failed to load image: <Pillow's message> Downscale the image to at most 178956970 pixels and
send it again."), which all three map to 400. Predicate: vLLM's own `load_bytes`, given a
1x1 PNG whose header says 14000x14000, raises `DecompressionBombError`.
"""

PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary="an image above Pillow's pixel limit (decompression bomb): 400 (ValueError) instead of 500",
    upstream="vllm/multimodal/media/image.py ImageMediaIO.load_bytes lets DecompressionBombError through (0.23-0.32)",
    check=check,
    apply=apply,
    fixes=("an image whose header claims more than Pillow's limit (178,956,970 pixels; a 411-byte PNG that says "
     '14000x14000) gets **500** (`DecompressionBombError`) instead of 400'),
    references='none (0.23, 0.30, 0.32: `ImageMediaIO.load_bytes` catches only `OSError`)',
    tests=("`test_media_loader_refusals_are_400s` (the target's `ImageMediaIO` + `create_error_response`: 400, 500 "
     "without); row 40 of `tests/test_bad_requests.py` (400 on 0.32's server)"),
    delete_when='`ImageMediaIO.load_bytes` raises a 4xx error for it',
    details=DETAILS,
    evidence={"0.30.0": ('applied', ('`multimodal/media/image.py:79-94`: `load_bytes` maps only `OSError` / '
                         '`UnidentifiedImageError` to `ValueError`; its `VLLM_MAX_IMAGE_PIXELS` check (:83-89) comes '
                         'after `Image.open`, which raises `DecompressionBombError` (500 without the plugin)'))},
)
