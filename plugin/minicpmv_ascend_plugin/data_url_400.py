"""A data: URL that is not base64 is a 400 that says to send base64, not a 501.

Bug (vLLM 0.23, 0.30 and 0.32, `vllm/multimodal/media/connector.py`): `MediaConnector._load_data_url`
refuses a data: URL without `;base64` (`data:image/png,%89PNG...`, `data:,hello` as a video) with
`NotImplementedError("Only base64 data URLs are supported for now.")`, which vLLM's
`create_error_response` maps to 501 NotImplementedError: a client's malformed input reported as a
missing server feature. (vLLM 0.23 splits the header differently: a URL without any `;` fails
there with a 400 "not enough values to unpack (expected 2, got 1)", one with another parameter,
`data:text/plain;charset=utf-8,...`, with the 501.) No upstream fix (0.23 - 0.33).

Fix: the same refusal as `ValueError` (400 BadRequestError) with how to send the media instead.
Percent-encoded data URLs are refused, not decoded: base64 is what OpenAI's API and every client
library send, and a second decoder would be a second parser of hostile input for no client.
Sync and async loaders both call `_load_data_url`.

Applies when: vLLM's own `_load_data_url`, given `data:image/png;charset=utf-8,hello` (a
parameter, no base64), raises NotImplementedError.
Delete when: it raises ValueError (or another 4xx error) upstream, or decodes such URLs.
"""

from __future__ import annotations

import functools
from typing import Any

from ._base import AT_REGISTER, LayoutNotFound, Patch, wrap_once

NAME = "data-url-400"
PROBE_URL = "data:image/png;charset=utf-8,hello"  # 501 on 0.23, 0.30 and 0.32 alike
MESSAGE = ("only base64 data URLs are accepted (data:<media type>;base64,<data>): this one is not "
           "base64-encoded ({url}); encode the file with base64, e.g. data:image/png;base64,iVBORw0KG...")


def not_base64(url: str) -> bool:
    """vLLM's own test (RFC 2397: data:[<mediatype>][;<param>=<value>]*[;base64],<data>)."""
    data_spec, sep, _ = url[5:].partition(",")
    if not sep:
        return False  # vLLM's ValueError (400) for a missing ',' stands
    _, sep, encoding = data_spec.rpartition(";")
    return not sep or encoding != "base64"


def _load_data_url(original: Any) -> Any:
    @functools.wraps(original)
    def load(self: Any, url: str, media_io: Any, *args: Any, **kwargs: Any) -> Any:
        if not_base64(url):
            raise ValueError(MESSAGE.format(url=url[:40] + ("..." if len(url) > 40 else "")))
        return original(self, url, media_io, *args, **kwargs)

    return load


def probe() -> BaseException | None:
    """What vLLM's own `_load_data_url` raises for a data URL that is not base64 (None: nothing)."""
    from vllm.multimodal.media.connector import MediaConnector

    loader = MediaConnector._load_data_url
    loader = getattr(loader, "_minicpmv_ascend_plugin_wraps", loader)  # vLLM's, not ours
    try:
        loader(MediaConnector(), PROBE_URL, None)
    except Exception as error:  # noqa: BLE001 - the exception type is what is probed
        return error
    return None


def check(_: Any) -> str | None:
    error = probe()
    if isinstance(error, (TypeError, AttributeError)):  # the call no longer fits vLLM's loader
        raise LayoutNotFound(f"vLLM's MediaConnector._load_data_url cannot be probed: {type(error).__name__}: {error}")
    if not isinstance(error, NotImplementedError):
        return f"vLLM refuses a non-base64 data URL with {type(error).__name__}, not NotImplementedError"
    return None


def apply(_: Any) -> None:
    from vllm.multimodal.media.connector import MediaConnector

    wrap_once(MediaConnector, "_load_data_url", _load_data_url)


# plugin/README.md's "Details and evidence" for this patch (Markdown; scripts/patch_table.py renders it).
DETAILS = r"""
wraps `MediaConnector._load_data_url` (both loaders call it): a data URL
without `;base64` (vLLM's own test, RFC 2397) raises `ValueError` ("only base64 data URLs are
accepted ...; encode the file with base64, e.g. data:image/png;base64,...") instead of vLLM's
`NotImplementedError` (501). Refused, not decoded: base64 is what OpenAI's API and client
libraries send, and a percent-decoder would be one more parser of hostile input for no client.
Predicate: vLLM's own `_load_data_url`, given `data:,hello`, raises `NotImplementedError`.
"""

PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary="data: URL that is not base64: 400 (ValueError) saying to send base64, instead of 501 "
            "(NotImplementedError)",
    upstream="vllm/multimodal/media/connector.py MediaConnector._load_data_url raises NotImplementedError (0.23-0.33)",
    check=check,
    apply=apply,
    fixes=('a `data:` URL that is not base64 (`data:image/png,%89PNG...`, `data:,hello`) gets **501** '
     '(`NotImplementedError` "Only base64 data URLs are supported for now.") instead of 400'),
    references='none (0.23 - 0.33, `MediaConnector._load_data_url`)',
    tests=('`test_media_loader_refusals_are_400s` (sync and async loaders + `create_error_response`: 400, 501 without); '
     "`tests/test_request_guard.py::test_non_base64_data_urls_are_400s_saying_to_send_base64` (400 on 0.32's server)"),
    delete_when='vLLM raises a 4xx error there (or decodes such URLs)',
    details=DETAILS,
    evidence={"0.30.0": ('applied', ('`multimodal/media/connector.py:325-328`: `_load_data_url` raises `NotImplementedError` for '
                         'a data URL without `;base64` (501 through `create_error_response`)'))},
)
