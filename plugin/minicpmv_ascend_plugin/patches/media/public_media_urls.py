"""`allowed_media_domains=public`: fetch image URLs from public addresses only."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from typing import Any

from ...core.patch import AT_REGISTER, LayoutNotFound, Patch
from ...core.wrap import wrap_once

NAME = "public-media-urls"
OWNER = "MediaConnector"
FUNCTIONS = ("load_from_url", "load_from_url_async", "_assert_url_in_allowed_media_domains")


def _public(connector: Any) -> list[str] | None:
    """The hosts listed next to `public` when this connector runs in public mode, else None."""
    from minicpmv_ascend.server.media_urls import PUBLIC_SENTINEL

    hosts = getattr(connector, "allowed_media_domains", None) or []
    return [h for h in hosts if h != PUBLIC_SENTINEL] if PUBLIC_SENTINEL in hosts else None


def _what(media_io: Any) -> str:
    name = type(media_io).__name__.lower()
    return next((kind for kind in ("video", "audio") if kind in name), "image")


def _fetch(connector: Any, url: str, media_io: Any, fetch_timeout: Any) -> bytes:
    from vllm import envs

    from minicpmv_ascend.server import media_urls

    return media_urls.fetch(url, explicit_hosts=_public(connector) or (), timeout=fetch_timeout,
                            max_bytes=media_urls.max_bytes_for(media_io),
                            allow_redirects=bool(envs.VLLM_MEDIA_URL_ALLOW_REDIRECTS), what=_what(media_io))


_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _fetch_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The fetch threads: as many as there are slots, so a fetch that got a slot never queues."""
    global _pool
    from minicpmv_ascend.server import media_urls

    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(media_urls.SLOTS.limit, thread_name_prefix="media-url")
        return _pool


def _fetch_in_slot(connector: Any, url: str, media_io: Any, fetch_timeout: Any) -> bytes:
    from minicpmv_ascend.server import media_urls

    try:
        return _fetch(connector, url, media_io, fetch_timeout)
    finally:
        media_urls.SLOTS.release()


async def _fetch_async(connector: Any, url: str, media_io: Any, fetch_timeout: Any) -> bytes:
    from minicpmv_ascend.server import media_urls

    media_urls.SLOTS.acquire(_what(media_io))  # over the bound: refused now, never queued
    future = _fetch_pool().submit(_fetch_in_slot, connector, url, media_io, fetch_timeout)
    # A fetch cancelled before it started (the client went away) gives its slot back here; one
    # that started gives it back when it ends, by its deadline at the latest.
    future.add_done_callback(lambda done: media_urls.SLOTS.release() if done.cancelled() else None)
    return await asyncio.wrap_future(future)


def _is_http(url: str) -> bool:
    return url[:7].lower() == "http://" or url[:8].lower() == "https://"


def _assert_allowed(original: Any) -> Any:
    @functools.wraps(original)
    def check(self: Any, url_spec: Any) -> None:
        if _public(self) is None:
            original(self, url_spec)  # names are checked by media_urls.fetch in public mode

    return check


def _load(original: Any) -> Any:
    @functools.wraps(original)
    def load(self: Any, url: str, media_io: Any, *, fetch_timeout: Any = None) -> Any:
        if _public(self) is None or not _is_http(url):
            return original(self, url, media_io, fetch_timeout=fetch_timeout)
        from minicpmv_ascend.server import media_urls

        media_urls.SLOTS.acquire(_what(media_io))
        return media_io.load_bytes(_fetch_in_slot(self, url, media_io, fetch_timeout))

    return load


def _load_async(original: Any) -> Any:
    @functools.wraps(original)
    async def load(self: Any, url: str, media_io: Any, *, fetch_timeout: Any = None) -> Any:
        if _public(self) is None or not _is_http(url):
            return await original(self, url, media_io, fetch_timeout=fetch_timeout)
        data = await _fetch_async(self, url, media_io, fetch_timeout)
        return await asyncio.get_running_loop().run_in_executor(None, media_io.load_bytes, data)

    return load


def check(_: Any) -> str | None:
    from vllm.multimodal.media.connector import MediaConnector

    missing = [name for name in FUNCTIONS if not hasattr(MediaConnector, name)]
    if missing:
        raise LayoutNotFound(f"vLLM's MediaConnector has no {', '.join(missing)} (another layout: public mode "
                             "not available)")
    return None


def apply(_: Any) -> None:
    from vllm.multimodal.media.connector import MediaConnector

    wrap_once(MediaConnector, "_assert_url_in_allowed_media_domains", _assert_allowed)
    wrap_once(MediaConnector, "load_from_url", _load)
    wrap_once(MediaConnector, "load_from_url_async", _load_async)


PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary="allowed_media_domains=public: image URLs fetched only from public addresses, each redirect "
            "checked, the connection pinned to the checked address",
    upstream="vllm-project/vllm#57157 (open); fix proposed in #57825",
    check=check,
    apply=apply,
    fixes=('`allowed_media_domains=public`: image URLs fetched only from public addresses (every host of the first URL and '
     'each redirect resolved once, refused unless all its addresses are public, the socket opened to the checked '
     "address; vLLM's fetch timeout per modality as ONE deadline for the whole fetch, enforced while a read blocks; "
     "at most `MEDIA_URL_FETCHES` fetches in flight in the plugin's own threads, one more a 400 at once); vLLM "
     "alone compares host names and reaches any address, and a trickling host held a fetch and a thread of asyncio's "
     'default pool as long as it trickled (active only for a server started with `public`)'),
    tests=('`tests/test_security.py::test_public_mode_refuses_loopback_under_every_spelling_for_real`, '
     '`::test_a_redirect_to_a_refused_address_is_not_followed`, '
     '`::test_trickling_image_hosts_get_a_400_by_the_deadline_and_starve_no_one`, `tests/test_media_urls.py` (slow '
     'hosts on loopback), `plugin/tests/patches/test_server_patches.py::test_public_media_urls_on_the_targets_connector`'),
    delete_when="vLLM checks every hop's resolved addresses and pins the connection",
    details=f"""
vLLM's `--allowed-media-domains` compares the URL's host NAME with a list, and redirects are followed
to any host unless `VLLM_MEDIA_URL_ALLOW_REDIRECTS=0` (0.23 - 0.33): a deployment can allow a few
named hosts or every host, but not "every public host, and nothing on the cluster's network" (what
OpenAI's API does). For `ALLOWED_MEDIA_DOMAINS=public` the launcher passes vLLM an allow-list entry
no URL host can equal (`minicpmv_ascend.server.media_urls.PUBLIC_SENTINEL`), plus the hosts listed
next to `public`. A `{OWNER}` holding that entry skips vLLM's host-name check and fetches http(s)
URLs with `minicpmv_ascend.server.media_urls.fetch` (the rules: docs/reliability.md, "Media
fetching"), in this plugin's own threads, at most `MEDIA_URL_FETCHES` at once (one more is a 400 at
once, so slow hosts neither starve other clients' fetches nor fill asyncio's default pool that vLLM
decodes media in); `data:` and `file://` stay vLLM's. Without the plugin, vLLM's own check refuses
every URL with the entry quoted (fail closed). Upstream: #57157 (SSRF to internal and link-local
addresses, open), address checks with pinned connections proposed in #57825 and per-hop allow-list
checks in #55539 (both unmerged); the allow-list came with CVE-2025-6242, the redirect switch with
#26035. Predicate: vLLM's `{OWNER}` has `{"`, `".join(FUNCTIONS)}` (0.23 - 0.33).
""",
    evidence={"0.30.0": ('applied', ('`multimodal/media/connector.py:355-364`: the allow-list compares the host name only; '
                         'redirects follow `VLLM_MEDIA_URL_ALLOW_REDIRECTS` (:391, :444)'))},
)
