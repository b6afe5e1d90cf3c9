"""A `file://` media URL on a server without `--allowed-local-media-path` is a 400, not a 500."""

from __future__ import annotations

from typing import Any

from ...core.patch import AT_REGISTER, Patch
from ...core.refusal import decide, raised_by, refuse

NAME = "file-url-400"
OWNER = "MediaConnector"
FUNCTION = "_load_file_url"  # both loaders, sync and async, call it
PROBE_URL = "file:///nonexistent/image.png"
MESSAGE = ("Cannot load local files without `--allowed-local-media-path`: this server does not read "
           "file:// URLs; send the image inline as a data: URL")


def problem(connector: Any, *_: Any, **__: Any) -> str | None:
    return MESSAGE if connector.allowed_local_media_path is None else None


def probe() -> BaseException | None:
    """What vLLM's own loader raises for PROBE_URL without a directory (None: nothing)."""
    from urllib3.util import parse_url
    from vllm.multimodal.media.connector import MediaConnector

    return raised_by(MediaConnector, FUNCTION, lambda load: load(MediaConnector(), parse_url(PROBE_URL), None))


def check(_: Any) -> str | None:
    from vllm.multimodal.media.connector import MediaConnector

    return decide(probe(), MediaConnector, FUNCTION, RuntimeError, "file:// without a directory")


def apply(_: Any) -> None:
    from vllm.multimodal.media.connector import MediaConnector

    refuse(MediaConnector, FUNCTION, before=problem)


PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary="file:// media URL without --allowed-local-media-path: 400 (ValueError) instead of 500 (RuntimeError)",
    upstream=f"vllm/multimodal/media/connector.py {OWNER}.{FUNCTION} raises RuntimeError (0.23-0.33)",
    check=check,
    apply=apply,
    fixes=('a `file://` image URL on a server without `--allowed-local-media-path` gets **500** (`RuntimeError`) instead '
           'of 400'),
    tests=('`test_media_loader_refusals_are_400s`; '
           '`tests/test_security.py::test_file_urls_only_inside_the_allowed_directory` (400 on 0.32)'),
    delete_when='vLLM raises a 4xx error there',
    details=f"""
wraps `{OWNER}.{FUNCTION}` (both the sync and async loaders call it): vLLM refuses a file:// URL
when no local media directory is configured (right), but with a `RuntimeError`, which its
`create_error_response` maps to 500, so clients and dashboards count the client's mistake as a
server fault (a file outside the directory is already a 400). With no directory configured the
patch raises `ValueError` ("{MESSAGE}"), 400 on 0.23, 0.30 and 0.32. Predicate: vLLM's own
`{FUNCTION}`, called on `{OWNER}()` for `{PROBE_URL}`, raises `RuntimeError`.
""",
    evidence={"0.30.0": ('applied', (f'`multimodal/media/connector.py:338-342`: `{FUNCTION}` raises `RuntimeError` '
                                     'without `--allowed-local-media-path` (500 through '
                                     '`entrypoints/serve/exception_handling/error_response.py`)'))},
)
