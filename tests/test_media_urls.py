"""`allowed_media_domains=public`: the decision on addresses, and where the connection goes.

No public address is reachable from this machine, so what `public` lets through is tested on
addresses, with a resolver stub standing in for DNS; the refusals are proven for real against the
server in tests/test_security.py (loopback under every spelling, a redirect to a refused address).
"""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from minicpmv_ascend.server import media_urls
from support.slow_hosts import SLOW_PATHS, SlowHost

# Addresses huggingface.co (the image host of the first seed document's example request:
# docs/design/seed-documents.md) and its CDN resolved to: public.
SEED_HOST = "huggingface.co"
PUBLIC = {SEED_HOST: ["18.239.50.16", "18.239.50.80", "2600:9000:234c:c800:17:b174:6d00:93a1"],
          "cdn-lfs.hf.co": ["3.167.152.69"]}
REFUSED = {
    "loopback": ["127.0.0.1"], "loopback6": ["::1"], "private": ["10.0.0.7"], "private172": ["172.16.5.4"],
    "private192": ["192.168.1.10"], "link-local": ["169.254.10.1"], "metadata": ["169.254.169.254"],
    "alibaba-metadata": ["100.100.100.200"], "oracle-metadata": ["192.0.0.192"], "azure-platform": ["168.63.129.16"],
    "aws-metadata6": ["fd00:ec2::254"], "shared-cgnat": ["100.64.1.1"], "multicast": ["224.0.0.251"],
    "multicast6": ["ff02::1"], "unspecified": ["0.0.0.0"], "reserved": ["240.0.0.1"], "ula6": ["fd12:3456::1"],
    "mapped-loopback": ["::ffff:127.0.0.1"], "nat64-loopback": ["64:ff9b::7f00:1"], "6to4-private": ["2002:a00:7::"],
    "documentation": ["192.0.2.1"], "link-local6": ["fe80::1"],
    # One private answer among public ones (a rebinding name, or a split-horizon zone): refused.
    "mixed": ["18.239.50.16", "10.0.0.7"], "unresolvable": [],
}


def stub_resolver(table: dict[str, list[str]]):
    calls: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        calls.append(host)
        if not table.get(host):
            raise OSError("no such host (resolver stub)")
        return table[host]

    resolve.calls = calls  # type: ignore[attr-defined]
    return resolve


def test_public_decision_on_addresses_with_a_resolver_stub_no_public_address_is_reachable_here():
    resolver = stub_resolver({**PUBLIC, **{f"{name}.example": addresses for name, addresses in REFUSED.items()}})
    for host, addresses in PUBLIC.items():
        assert media_urls.public_addresses(host, 443, resolver) == addresses
    for name in REFUSED:
        with pytest.raises(media_urls.MediaURLRefused) as refused:
            media_urls.public_addresses(f"{name}.example", 443, resolver)
        message = str(refused.value)
        # The same words for "private" and "does not resolve", and never the address: a client must
        # not map the server's internal DNS through error messages.
        assert "not on a public address" in message and "ALLOWED_MEDIA_DOMAINS=public" in message
        assert not any(address in message for address in REFUSED[name] if address)


def test_each_refused_address_says_why():
    assert media_urls.address_problem("127.0.0.1") == "a loopback address"
    assert media_urls.address_problem("169.254.169.254") == "a cloud metadata address"
    assert media_urls.address_problem("::ffff:10.0.0.1") == "an IPv6 form of a private address"
    assert media_urls.address_problem("224.0.0.251") == "a multicast address"
    for address in PUBLIC[SEED_HOST]:
        assert media_urls.address_problem(address) is None


class RecordingConnection:
    """A stand-in for the pinned HTTP connection: records where it was asked to connect, then fails
    as an unreachable host does (no public address is reachable from here)."""

    opened: list[tuple[str, int, str]] = []

    class HTTP:
        def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
            RecordingConnection.opened.append((host, port, address))

        def request(self, *args, **kwargs) -> None:
            raise OSError("unreachable (connection stub)")

        def close(self) -> None:
            pass

    HTTPS = HTTP


def test_the_connection_goes_to_the_checked_address_with_a_connection_stub():
    """Resolved once, checked, and the socket opened to that IP: a second DNS answer (rebinding)
    has no moment to slip in."""
    RecordingConnection.opened.clear()
    resolver = stub_resolver(PUBLIC)
    with pytest.raises(media_urls.MediaURLRefused, match="fetching the image URL failed"):
        media_urls.fetch(f"https://{SEED_HOST}/datasets/openbmb/DemoCase/resolve/main/refract.png",
                         resolver=resolver, connection=RecordingConnection)
    assert resolver.calls == [SEED_HOST]  # type: ignore[attr-defined]
    assert RecordingConnection.opened == [(SEED_HOST, 443, PUBLIC[SEED_HOST][0])]


def test_only_http_and_https_and_listed_hosts_skip_the_check():
    for url in ("ftp://example.com/a.png", "gopher://x/", "http:///nohost"):
        with pytest.raises(media_urls.MediaURLRefused, match="only http and https"):
            media_urls.fetch(url, resolver=stub_resolver({}), connection=RecordingConnection)
    RecordingConnection.opened.clear()
    with pytest.raises(media_urls.MediaURLRefused, match="failed"):  # listed: resolved by the system, no check
        media_urls.fetch("http://localhost:9/a.png", explicit_hosts=["localhost"], connection=RecordingConnection)
    assert RecordingConnection.opened and RecordingConnection.opened[0][2] in ("127.0.0.1", "::1")


def test_without_the_plugin_vllm_refuses_every_url_in_public_mode():
    """Fail closed: vLLM's own allow-list check (the plugin's wrapper removed) with what the
    launcher passes for `public` refuses any host, and its message quotes the entry."""
    from urllib3.util import parse_url
    from vllm.multimodal.media.connector import MediaConnector

    check = MediaConnector._assert_url_in_allowed_media_domains
    check = getattr(check, "_minicpmv_ascend_plugin_wraps", check)
    connector = MediaConnector(allowed_media_domains=[media_urls.PUBLIC_SENTINEL])
    for url in (f"https://{SEED_HOST}/a.png", "http://127.0.0.1/a.png"):
        with pytest.raises(ValueError, match="public addresses only"):
            check(connector, parse_url(url))


# --------------------------------------------------------------------------------------------
# One deadline for the whole fetch, against real slow hosts on loopback (tests/support/slow_hosts.py)
# --------------------------------------------------------------------------------------------

DEADLINE_S = 1.0  # short here; the server's are vLLM's (5 s image, 30 s video)
SLACK_S = 0.6  # what a contended 2-core machine adds to the refusal


def timed_fetch(url: str, **kwargs) -> tuple[float, str]:
    started = time.monotonic()
    try:
        media_urls.fetch(url, explicit_hosts=["127.0.0.1"], timeout=DEADLINE_S, **kwargs)
        outcome = "fetched"
    except media_urls.MediaURLRefused as refusal:
        outcome = str(refusal)
    return time.monotonic() - started, outcome


def test_every_slow_host_is_cut_at_the_deadline_while_a_normal_fetch_beside_them_is_served():
    """Trickled body (with and without Content-Length, chunked), stalled body, trickled headers, no
    answer at all: each is refused by the deadline (+ slack), not after its last byte (minutes),
    all at once and beside a normal fetch that is served at once."""
    with SlowHost(interval=0.3) as host, concurrent.futures.ThreadPoolExecutor(len(SLOW_PATHS) * 3 + 1) as pool:
        slow = {(path, i): pool.submit(timed_fetch, host.url(path)) for path in SLOW_PATHS for i in range(3)}
        normal = pool.submit(timed_fetch, host.url("/png"))
        seconds, outcome = normal.result()
        assert outcome == "fetched" and seconds < 0.5, (seconds, outcome)
        for (path, _), future in slow.items():
            seconds, outcome = future.result()
            assert "took longer than 1 s" in outcome and "data: URL" in outcome, (path, outcome)
            assert DEADLINE_S - 0.05 <= seconds < DEADLINE_S + SLACK_S, (path, seconds)


def test_the_video_deadline_and_message_follow_the_modality():
    with SlowHost(interval=0.3) as host:
        seconds, outcome = timed_fetch(host.url("/trickle"), what="video")
    assert "fetching the video URL took longer than 1 s" in outcome and seconds < DEADLINE_S + SLACK_S


def test_a_slow_name_resolution_is_abandoned_at_the_deadline():
    """The resolver is the injectable one (a real slow DNS server would need the system's resolver
    configuration): it sleeps 5 s; the fetch gives up by the deadline."""
    def slow_resolver(host: str, port: int) -> list[str]:
        time.sleep(5)
        return PUBLIC[SEED_HOST]

    started = time.monotonic()
    with pytest.raises(media_urls.MediaURLRefused, match="took longer than 1 s"):
        media_urls.fetch(f"https://{SEED_HOST}/a.png", timeout=DEADLINE_S, resolver=slow_resolver,
                         connection=RecordingConnection)
    assert time.monotonic() - started < DEADLINE_S + SLACK_S


def test_the_deadline_covers_every_redirect_hop():
    """Each hop answers its redirect after 0.3 s (5 redirects: 1.8 s): the ONE deadline cuts the
    chain, not one deadline per hop."""
    with SlowHost(interval=0.3) as host:
        seconds, outcome = timed_fetch(host.url("/hop"))
        assert "took longer than 1 s" in outcome and seconds < DEADLINE_S + SLACK_S, (seconds, outcome)
        assert 3 <= len(host.requests) <= 4, host.requests


def test_the_fetch_bound_refuses_at_once_and_gives_slots_back():
    slots = media_urls.FetchSlots(2)
    slots.acquire()
    slots.acquire()
    started = time.monotonic()
    with pytest.raises(media_urls.MediaURLBusy, match="fetching 2 media URLs already.*MEDIA_URL_FETCHES=2"):
        slots.acquire("video")
    assert time.monotonic() - started < 0.1
    slots.release()
    slots.acquire()  # a slot given back is usable again
    assert slots.in_flight == 2


def test_a_tls_handshake_trickled_byte_by_byte_is_cut_at_the_deadline():
    """https: a server that answers the ClientHello with one byte every 0.3 s (a TLS record that
    never completes): the handshake is bounded by the same deadline."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            while not stop.wait(0.3):
                try:
                    connection.send(b"\x16")
                except OSError:
                    return

    threading.Thread(target=serve, daemon=True).start()
    try:
        seconds, outcome = timed_fetch(f"https://127.0.0.1:{listener.getsockname()[1]}/a.png")
    finally:
        stop.set()
        listener.close()
    assert "took longer than 1 s" in outcome and seconds < DEADLINE_S + SLACK_S, (seconds, outcome)


def test_the_plugins_fetches_are_bounded_refused_at_once_past_it_and_give_their_slots_back(monkeypatch):
    """The plugin's async path (public-media-urls): fetches take a slot before they are submitted to
    its own pool; with 2 slots held by stalled hosts a third is refused at once (MediaURLBusy, a
    400 through vLLM), and once the stalled ones hit their deadline the slots are free again."""
    import asyncio

    from vllm.multimodal.media.connector import MediaConnector
    from vllm.multimodal.media.image import ImageMediaIO

    from minicpmv_ascend_plugin.patches.media import public_media_urls

    monkeypatch.setattr(media_urls, "SLOTS", media_urls.FetchSlots(2))
    monkeypatch.setattr(public_media_urls, "_pool", None)
    connector = MediaConnector(allowed_media_domains=[media_urls.PUBLIC_SENTINEL, "127.0.0.1"])

    async def main(host: SlowHost) -> tuple[list, float, str, bytes]:
        stalled = [asyncio.ensure_future(public_media_urls._fetch_async(connector, host.url("/stall"), ImageMediaIO(),
                                                                        DEADLINE_S)) for _ in range(2)]
        await asyncio.sleep(0.2)
        started = time.monotonic()
        try:
            await public_media_urls._fetch_async(connector, host.url("/png"), ImageMediaIO(), DEADLINE_S)
            busy = "fetched"
        except media_urls.MediaURLBusy as refusal:
            busy = str(refusal)
        busy_s = time.monotonic() - started
        outcomes = await asyncio.gather(*stalled, return_exceptions=True)
        data = await public_media_urls._fetch_async(connector, host.url("/png"), ImageMediaIO(), DEADLINE_S)
        return outcomes, busy_s, busy, data

    with SlowHost() as host:
        outcomes, busy_s, busy, data = asyncio.run(main(host))
    assert "fetching 2 media URLs already" in busy and busy_s < 0.1, (busy, busy_s)
    assert all(isinstance(o, media_urls.MediaURLRefused) and "took longer than 1 s" in str(o) for o in outcomes)
    assert data.startswith(b"\x89PNG") and media_urls.SLOTS.in_flight == 0
    public_media_urls._pool.shutdown(wait=False)
