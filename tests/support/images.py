"""The one PNG maker of the tests, written without PIL (the unit tier imports nothing heavy): solid
images, images with a centred square (what the request tests send), incompressible noise, and a
PNG whose header claims another size."""

from __future__ import annotations

import base64
import functools
import os
import struct
import zlib

RED = (200, 30, 30)
WHITE = (255, 255, 255)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def _encode(width: int, height: int, rows: list[bytes], level: int = 6) -> bytes:
    """An 8-bit RGB PNG of `rows` (each width x 3 bytes)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    data = zlib.compress(b"".join(b"\x00" + row for row in rows), level)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", data) + _chunk(b"IEND", b"")


def png_bytes(width: int, height: int, colour: tuple[int, int, int] = RED,
              background: tuple[int, int, int] | None = None) -> bytes:
    """A width x height RGB PNG: all `colour`, or, with `background`, a `colour` square over the
    middle half of each side ([w/4, 3w/4) x [h/4, 3h/4)) on `background`."""
    if background is None:
        return _encode(width, height, [bytes(colour) * width] * height)
    left, right, top, bottom = width // 4, 3 * width // 4, height // 4, 3 * height // 4
    edge = bytes(background) * width
    middle = bytes(background) * left + bytes(colour) * (right - left) + bytes(background) * (width - right)
    return _encode(width, height, [middle if top <= y < bottom else edge for y in range(height)])


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


@functools.cache
def png_url(width: int, height: int, colour: tuple[int, int, int] = RED) -> str:
    """A data URL of a `colour` square on white (the request tests' image)."""
    return data_url(png_bytes(width, height, colour, background=WHITE))


@functools.cache
def noise_png_url(side: int) -> str:
    """An incompressible PNG: side x side random pixels, stored uncompressed (~3 bytes/pixel)."""
    return data_url(_encode(side, side, [os.urandom(side * 3) for _ in range(side)], level=0))


@functools.cache
def video_frames_url(side: int, frames: int) -> str:
    """A `video/jpeg` data URL (vLLM's inline frame list) of `frames` solid side x side frames.
    PNG frames: vLLM and Pillow read any image format there, and a solid PNG is a few KiB."""
    frame = base64.b64encode(png_bytes(side, side)).decode()
    return "data:video/jpeg;base64," + ",".join([frame] * frames)


def png_claiming(width: int, height: int) -> str:
    """A 1x1 PNG whose header claims width x height: Pillow refuses it on open, before decoding
    (its decompression-bomb limit is 178,956,970 pixels), so the test costs nothing."""
    data = bytearray(png_bytes(1, 1))
    header = struct.pack(">II", width, height) + bytes(data[24:29])
    data[16:29] = header
    data[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + header) & 0xFFFFFFFF)
    return data_url(bytes(data))
