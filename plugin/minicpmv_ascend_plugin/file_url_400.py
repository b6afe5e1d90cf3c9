"""A `file://` media URL on a server without `--allowed-local-media-path` is a 400, not a 500.

Bug (vLLM 0.23 and 0.32, `vllm/multimodal/media/connector.py`): `MediaConnector._load_file_url`
refuses a file:// URL when no local media directory is configured (right), but with a
`RuntimeError`, which vLLM's `create_error_response` maps to 500 InternalServerError: clients and
dashboards count the client's mistake as a server fault. The refusal of a file outside the
directory is already a `ValueError` (400). No upstream fix (0.23 - 0.33).

Fix: the same refusal, with vLLM's message and how to send the image instead, as `ValueError`,
which vLLM maps to 400 BadRequestError. Sync and async loaders both call `_load_file_url`.

Applies when: vLLM's own `_load_file_url`, called on a `MediaConnector()` without a directory,
raises RuntimeError.
Delete when: that call raises ValueError (or another 4xx error) upstream.
"""

from __future__ import annotations

import functools
from typing import Any

from ._base import AT_REGISTER, LayoutNotFound, Patch, wrap_once

NAME = "file-url-400"
MESSAGE = ("Cannot load local files without `--allowed-local-media-path`: this server does not read "
           "file:// URLs; send the image inline as a data: URL")


def _load_file_url(original: Any) -> Any:
    @functools.wraps(original)
    def load(self: Any, url_spec: Any, media_io: Any) -> Any:
        if self.allowed_local_media_path is None:
            raise ValueError(MESSAGE)
        return original(self, url_spec, media_io)

    return load


def probe() -> BaseException | None:
    """What vLLM's own `_load_file_url` raises for file:// without a directory (None: nothing)."""
    from urllib3.util import parse_url
    from vllm.multimodal.media.connector import MediaConnector

    loader = MediaConnector._load_file_url
    loader = getattr(loader, "_minicpmv_ascend_plugin_wraps", loader)  # vLLM's, not ours
    try:
        loader(MediaConnector(), parse_url("file:///nonexistent/image.png"), None)
    except Exception as error:  # noqa: BLE001 - the exception type is what is probed
        return error
    return None


def check(_: Any) -> str | None:
    error = probe()
    if isinstance(error, (TypeError, AttributeError)):  # the call no longer fits vLLM's loader
        raise LayoutNotFound(f"vLLM's MediaConnector._load_file_url cannot be probed: {type(error).__name__}: {error}")
    if not isinstance(error, RuntimeError):
        return f"vLLM refuses file:// without a directory with {type(error).__name__}, not RuntimeError"
    return None


def apply(_: Any) -> None:
    from vllm.multimodal.media.connector import MediaConnector

    wrap_once(MediaConnector, "_load_file_url", _load_file_url)


# plugin/README.md's "Details and evidence" for this patch (Markdown; scripts/patch_table.py renders it).
DETAILS = r"""
wraps `MediaConnector._load_file_url` (both the sync and async loaders call
it): with no directory configured it raises `ValueError` ("Cannot load local files without
`--allowed-local-media-path`: this server does not read file:// URLs; send the image inline as a
data: URL"), which vLLM's `create_error_response` maps to 400 on 0.23, 0.30 and 0.32. Predicate: vLLM's
own `_load_file_url`, called on `MediaConnector()` for a file:// URL, raises `RuntimeError`.
"""

PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary="file:// media URL without --allowed-local-media-path: 400 (ValueError) instead of 500 (RuntimeError)",
    upstream="vllm/multimodal/media/connector.py MediaConnector._load_file_url raises RuntimeError (0.23-0.33)",
    check=check,
    apply=apply,
    fixes=('a `file://` image URL on a server without `--allowed-local-media-path` gets **500** (`RuntimeError`) instead '
     'of 400'),
    references='none (0.23 - 0.33, `MediaConnector._load_file_url`)',
    tests=('`test_media_loader_refusals_are_400s`; '
     '`tests/test_security.py::test_file_urls_only_inside_the_allowed_directory` (400 on 0.32)'),
    delete_when='vLLM raises a 4xx error there',
    details=DETAILS,
    evidence={"0.30.0": ('applied', ('`multimodal/media/connector.py:338-342`: `_load_file_url` raises `RuntimeError` without '
                         '`--allowed-local-media-path` (500 through '
                         '`entrypoints/serve/exception_handling/error_response.py`)'))},
)
