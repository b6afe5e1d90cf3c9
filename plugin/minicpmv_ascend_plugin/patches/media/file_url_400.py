"""A `file://` media URL is a 400 whenever it cannot be served, and reads a bounded regular file."""

from __future__ import annotations

import functools
import os
import pathlib
import stat
import tempfile
from typing import Any
from urllib.request import url2pathname

from ...core.patch import AT_REGISTER, Patch
from ...core.refusal import decide, raised_by
from ...core.wrap import wrap_once

NAME = "file-url-400"
OWNER = "MediaConnector"
FUNCTION = "_load_file_url"  # both loaders, sync and async, call it
PROBE_URL = "file:///nonexistent/image.png"
MESSAGE = ("Cannot load local files without `--allowed-local-media-path`: this server does not read "
           "file:// URLs; send the image inline as a data: URL")
LIMIT_ENV = "VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB"


def _inside(connector: Any, url_spec: Any) -> pathlib.Path | None:
    """The file a URL names, resolved, when it lies inside the allowed directory (vLLM's rule)."""
    path = pathlib.Path(url2pathname((url_spec.netloc or "") + (url_spec.path or ""))).resolve()
    return path if connector.allowed_local_media_path in path.parents else None


def read_bounded(path: pathlib.Path, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most `max_bytes`, read at most once past the bound;
    ValueError (400) for anything else, at once: a FIFO opens without waiting for a writer."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise ValueError(f"cannot read the file:// URL's file: {error.strerror}") from None
    too_large = (f"the file:// URL's file is larger than this server's limit of {max_bytes} bytes "
                 f"({LIMIT_ENV}, the same bound as media downloads); send a smaller file")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("the file:// URL names something that is not a regular file (a directory, a "
                             "FIFO or a device); send a media file, or the media inline as a data: URL")
        if info.st_size > max_bytes:
            raise ValueError(too_large)
        with os.fdopen(os.dup(fd), "rb") as file:
            data = file.read(max_bytes + 1)
    except OSError as error:
        raise ValueError(f"cannot read the file:// URL's file: {error.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # it grew since the size was read
        raise ValueError(too_large)
    return data


def make_loader(original: Any) -> Any:
    @functools.wraps(original)
    def load_file_url(connector: Any, url_spec: Any, media_io: Any) -> Any:
        if connector.allowed_local_media_path is None:
            raise ValueError(MESSAGE)
        path = _inside(connector, url_spec)
        if path is None:
            return original(connector, url_spec, media_io)  # outside: vLLM's own 400
        from minicpmv_ascend.server import media_urls

        # = load_file, bounded as media downloads are
        return media_io.load_bytes(read_bounded(path, media_urls.max_bytes_for(media_io)))

    return load_file_url


def probe() -> BaseException | None:
    """What vLLM's own loader raises for PROBE_URL without a directory (None: nothing)."""
    from urllib3.util import parse_url
    from vllm.multimodal.media.connector import MediaConnector

    return raised_by(MediaConnector, FUNCTION, lambda load: load(MediaConnector(), parse_url(PROBE_URL), None))


class _OneByteIO:
    """A media IO that accepts at most one byte, and reports how many it was given."""

    def get_max_bytes(self) -> int:
        return 1

    def load_bytes(self, data: bytes) -> int:
        return len(data)

    def load_file(self, filepath: pathlib.Path) -> int:
        return len(pathlib.Path(filepath).read_bytes())


def probe_unbounded() -> bool:
    """Whether vLLM's own loader hands a media IO a file larger than the IO accepts."""
    from urllib3.util import parse_url
    from vllm.multimodal.media.connector import MediaConnector

    with tempfile.TemporaryDirectory() as directory:
        path = pathlib.Path(directory, "two-bytes.bin")
        path.write_bytes(b"ab")
        connector = MediaConnector(allowed_local_media_path=directory)
        error = raised_by(MediaConnector, FUNCTION, lambda load: load(connector, parse_url(path.as_uri()), _OneByteIO()))
    return error is None


def check(_: Any) -> str | None:
    from vllm.multimodal.media.connector import MediaConnector

    reason = decide(probe(), MediaConnector, FUNCTION, RuntimeError, "file:// without a directory")
    if reason is None or probe_unbounded():
        return None
    return f"{reason}, and it bounds the files it reads"


def apply(_: Any) -> None:
    from vllm.multimodal.media.connector import MediaConnector

    wrap_once(MediaConnector, FUNCTION, make_loader)


PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary=("file:// media URL: 400 (ValueError) instead of 500 without --allowed-local-media-path; inside it "
             "only a regular file within the media download bound"),
    upstream=(f"vllm/multimodal/media/connector.py {OWNER}.{FUNCTION} raises RuntimeError without a directory, "
              "and reads any file inside it whole (0.23-0.33)"),
    check=check,
    apply=apply,
    fixes=('a `file://` image URL on a server without `--allowed-local-media-path` gets **500** (`RuntimeError`) instead '
           'of 400; with a directory, a 3 GiB file in it as a `video_url` is read into the API server\'s memory '
           '(+5.2 GiB) and crashes it in PyAV, a FIFO blocks a loader thread for good, a path that does not exist '
           'is a 500'),
    tests=('`test_media_loader_refusals_are_400s`, `test_file_url_reads_are_bounded_on_the_targets_loader`; '
           '`tests/test_security.py::test_file_urls_only_inside_the_allowed_directory` and '
           '`test_local_files_are_bounded_like_downloads` (0.32)'),
    delete_when='vLLM raises a 4xx error without a directory and bounds the files it reads',
    details=f"""
wraps `{OWNER}.{FUNCTION}` (both the sync and async loaders call it). Without a directory vLLM
refuses a file:// URL (right) with a `RuntimeError`, which its `create_error_response` maps to
500; the patch raises `ValueError` ("{MESSAGE}"), 400 on 0.23, 0.30 and 0.32. Inside the
directory vLLM calls the media IO's `load_file`, which reads the whole file whatever its size
or kind; the patch opens the resolved path without blocking (`O_NONBLOCK`: a FIFO does not wait
for a writer), refuses what is not a regular file, and a file larger than the media download
bound (`{LIMIT_ENV}` when set, else 20 MiB, never above the media IO's own `get_max_bytes`: the
bound of image URLs) before reading, reads at most one byte past the bound (a file that grew is
refused too), and hands the bytes to `load_bytes`, which every media IO's `load_file` calls
after reading the file. A path outside the directory still gets vLLM's own 400. Every refusal is
a `ValueError` (400). Predicate: vLLM's own `{FUNCTION}`, called on `{OWNER}()` for `{PROBE_URL}`,
raises `RuntimeError`, or hands a two-byte file in a temporary directory to a media IO that
accepts one byte.
""",
    evidence={"0.30.0": ('applied', (f'`multimodal/media/connector.py:338-353`: `{FUNCTION}` raises `RuntimeError` '
                                     'without `--allowed-local-media-path` (500 through '
                                     '`entrypoints/serve/exception_handling/error_response.py`), then '
                                     '`media_io.load_file(filepath)`: `read_bytes()` of any file'))},
)
