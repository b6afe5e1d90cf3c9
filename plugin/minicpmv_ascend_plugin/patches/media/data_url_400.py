"""A data: URL that is not base64 is a 400 that says to send base64, not a 501."""

from __future__ import annotations

from typing import Any

from ...core.patch import AT_REGISTER, Patch
from ...core.refusal import decide, raised_by, refuse

NAME = "data-url-400"
OWNER = "MediaConnector"
FUNCTION = "_load_data_url"  # both loaders, sync and async, call it
PROBE_URL = "data:image/png;charset=utf-8,hello"  # a parameter, no base64: 501 on 0.23, 0.30 and 0.32 alike
MESSAGE = ("only base64 data URLs are accepted (data:<media type>;base64,<data>): this one is not "
           "base64-encoded ({url}); encode the file with base64, e.g. data:image/png;base64,iVBORw0KG...")


def not_base64(url: str) -> bool:
    """vLLM's own test (RFC 2397: data:[<mediatype>][;<param>=<value>]*[;base64],<data>)."""
    data_spec, sep, _ = url[5:].partition(",")
    if not sep:
        return False  # vLLM's ValueError (400) for a missing ',' stands
    _, sep, encoding = data_spec.rpartition(";")
    return not sep or encoding != "base64"


def problem(_connector: Any, url: str, *_: Any, **__: Any) -> str | None:
    if not_base64(url):
        return MESSAGE.format(url=url[:40] + ("..." if len(url) > 40 else ""))
    return None


def probe() -> BaseException | None:
    """What vLLM's own loader raises for PROBE_URL (None: nothing)."""
    from vllm.multimodal.media.connector import MediaConnector

    return raised_by(MediaConnector, FUNCTION, lambda load: load(MediaConnector(), PROBE_URL, None))


def check(_: Any) -> str | None:
    from vllm.multimodal.media.connector import MediaConnector

    return decide(probe(), MediaConnector, FUNCTION, NotImplementedError, "a non-base64 data URL")


def apply(_: Any) -> None:
    from vllm.multimodal.media.connector import MediaConnector

    refuse(MediaConnector, FUNCTION, before=problem)


PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary="data: URL that is not base64: 400 (ValueError) saying to send base64, instead of 501 "
            "(NotImplementedError)",
    upstream=f"vllm/multimodal/media/connector.py {OWNER}.{FUNCTION} raises NotImplementedError (0.23-0.33)",
    check=check,
    apply=apply,
    fixes=('a `data:` URL that is not base64 (`data:image/png,%89PNG...`, `data:,hello`) gets **501** '
           '(`NotImplementedError` "Only base64 data URLs are supported for now.") instead of 400'),
    tests=('`test_media_loader_refusals_are_400s` (sync and async loaders + `create_error_response`: 400, 501 without); '
           "`tests/test_request_guard.py::test_non_base64_data_urls_are_400s_saying_to_send_base64` (400 on 0.32's server)"),
    delete_when='vLLM raises a 4xx error there (or decodes such URLs)',
    details=f"""
wraps `{OWNER}.{FUNCTION}` (both loaders call it): a data URL without `;base64` (vLLM's own test,
RFC 2397) raises `ValueError` ("{MESSAGE.format(url='...')}") instead of vLLM's
`NotImplementedError`, which `create_error_response`
maps to 501: a client's malformed input reported as a missing server feature. vLLM 0.23 splits the
header differently: a URL without any `;` fails there with a 400 ("not enough values to unpack"),
one with another parameter with the 501. Refused, not decoded: base64 is what OpenAI's API and
client libraries send, and a percent-decoder would be one more parser of hostile input for no
client. Predicate: vLLM's own `{FUNCTION}`, given `{PROBE_URL}`, raises `NotImplementedError`.
""",
    evidence={"0.30.0": ('applied', (f'`multimodal/media/connector.py:325-328`: `{FUNCTION}` raises `NotImplementedError` '
                                     'for a data URL without `;base64` (501 through `create_error_response`)'))},
)
