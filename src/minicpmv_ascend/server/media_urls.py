"""Fetching images by URL from PUBLIC addresses only (`allowed_media_domains=public`).

Why: vLLM's own allow-list (`--allowed-media-domains`) compares host NAMES and, unless told not to,
follows redirects to any host; "any host" (`*`, vLLM's default) lets anyone who can send a request
make the server fetch from its own network: the cluster's private addresses, the node's loopback
services, the cloud's metadata endpoint (server-side request forgery). OpenAI's API fetches any
public URL; `public` does that and nothing more.

The rule, for the first URL and for every redirect:
1. http or https only;
2. a host the operator listed next to `public` (`public,images.internal`) is fetched as listed, the
   way vLLM's allow-list would (the operator's decision, private addresses included);
3. any other host is resolved ONCE, and refused unless EVERY address it resolves to is public: not
   loopback, private, link-local, shared (CGNAT), multicast, reserved or unspecified, not an IPv6
   form of such an IPv4 address (mapped, 6to4, NAT64, Teredo), not a cloud metadata address;
4. the connection goes to an address that was checked (the socket is opened to that IP; TLS still
   verifies the certificate for the host name), so a second DNS answer cannot swap in another
   address between the check and the connection (DNS rebinding);
5. limits: the caller's timeout is ONE deadline for the whole fetch: name resolution, connect, TLS,
   every redirect hop, the header lines and every byte of the body. It is enforced while a read is
   blocked: each receive waits at most the time left (the socket's timeout is set from the
   remaining budget before every recv, send and handshake), so a host sending one byte a second
   cannot stretch a fetch past it; a resolver call runs in its own thread and is abandoned at the
   deadline (getaddrinfo cannot be interrupted; the thread ends with the system resolver's own
   timeout). At most MAX_REDIRECTS redirects, at most `max_bytes` of body (Content-Length checked
   first, then while reading);
6. at most `FetchSlots.limit` fetches in flight (MEDIA_URL_FETCHES, the plugin's own threads): one
   over it is refused at once (`MediaURLBusy`), so slow hosts cannot starve fetches for other
   clients nor the threads the server needs for anything else.

Proxies from the environment (HTTP_PROXY...) are NOT used: behind a proxy the proxy would resolve
the name, and the check would be on the wrong side.

Refusals raise `MediaURLRefused` (a ValueError: vLLM answers 400). They never say which address a
name resolved to, nor distinguish "private" from "does not resolve": a client must not learn the
server's internal DNS from error messages.

No vLLM import here: the plugin (`minicpmv_ascend_plugin.patches.media.public_media_urls`) hooks this into vLLM's
media connector; the launcher only passes the setting on.
"""

from __future__ import annotations

import http.client
import ipaddress
import os
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from typing import Any

# The setting's keyword, and the entry the launcher hands vLLM's allow-list in its place. vLLM
# quotes its allow-list in its 400 answer, so a server where the plugin is off (and vLLM's own
# check runs) refuses every URL with this hint; the entry can never equal a URL's host (spaces).
PUBLIC = "public"
PUBLIC_SENTINEL = "public (public addresses only; needs the minicpmv-ascend vLLM plugin)"
SETTING_HINT = "ALLOWED_MEDIA_DOMAINS=public"

MAX_REDIRECTS = 5
DEFAULT_MAX_BYTES = 20 * 1024 * 1024  # 20 MiB, OpenAI's limit per image
# Fetches in flight, server-wide (MEDIA_URL_FETCHES; the launcher declares the setting). 32: an honest
# fetch takes ~0.1-0.5 s, so 32 slots carry 60+ fetches a second, more than the engine can encode
# images; a slow host holds a slot for at most the deadline (5 s image, 30 s video); the worst-case
# memory of full bodies is 32 x 20 MiB; and the slots are the plugin's own threads, not asyncio's
# default pool (min(32, cpus + 4) workers) nor vLLM's media pool (VLLM_MEDIA_LOADING_THREAD_COUNT=8),
# which therefore stay free for decoding and everything else.
FETCHES_ENV = "MEDIA_URL_FETCHES"
DEFAULT_FETCHES = 32
RECV_CHUNK = 16384  # body read size: each read returns what has arrived, never waits past the deadline
USER_AGENT = "minicpmv-ascend-media-fetch/1"

# Addresses cloud platforms serve instance metadata and credentials on. Most are link-local or
# private anyway; the ones that are not are why this list exists.
METADATA_NETWORKS = tuple(ipaddress.ip_network(n) for n in (
    "169.254.169.254/32",  # AWS, GCP, Azure, Huawei Cloud, OpenStack, Oracle (also link-local)
    "169.254.0.23/32",  # Tencent Cloud
    "100.100.100.200/32",  # Alibaba Cloud (shared address space)
    "168.63.129.16/32",  # Azure platform endpoint (a public address)
    "192.0.0.0/24",  # IETF protocol assignments; Oracle Cloud serves metadata on 192.0.0.192
    "fd00:ec2::254/128",  # AWS IPv6
))

Resolver = Callable[[str, int], Sequence[str]]


class MediaURLRefused(ValueError):
    """This URL is not fetched: the message says why and what the client can do instead."""


class MediaURLBusy(MediaURLRefused):
    """Every fetch slot is taken: refused at once (a 400 that says so), never queued."""


class FetchSlots:
    """A non-blocking counter of the fetches in flight."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, int(limit))
        self.in_flight = 0
        self._lock = threading.Lock()

    def acquire(self, what: str = "image") -> None:
        with self._lock:
            if self.in_flight >= self.limit:
                raise MediaURLBusy(
                    f"the server is fetching {self.limit} media URLs already ({FETCHES_ENV}={self.limit}); "
                    f"retry later, or send the {what} inline as a base64 data: URL")
            self.in_flight += 1

    def release(self) -> None:
        with self._lock:
            self.in_flight = max(0, self.in_flight - 1)


def fetches_from_env() -> int:
    configured = os.environ.get(FETCHES_ENV, "").strip()
    return int(configured) if configured.isdigit() and int(configured) > 0 else DEFAULT_FETCHES


SLOTS = FetchSlots(fetches_from_env())


def refused(host: str, why: str) -> MediaURLRefused:
    return MediaURLRefused(
        f"image URL refused: {why} ({host}). This server fetches images by URL only from public "
        f"addresses ({SETTING_HINT}); send the image inline as a data: URL instead")


def address_problem(address: str) -> str | None:
    """Why this IP address is not public (None: it is)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # drop an IPv6 zone id
    if any(ip in net for net in METADATA_NETWORKS if net.version == ip.version):
        return "a cloud metadata address"
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = [ip.ipv4_mapped, ip.sixtofour, ip.teredo[1] if ip.teredo else None]
        if ip in ipaddress.ip_network("64:ff9b::/96") or ip in ipaddress.ip_network("64:ff9b:1::/48"):
            embedded.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))  # NAT64
        for inner in filter(None, embedded):
            problem = address_problem(str(inner))
            if problem:
                return f"an IPv6 form of {problem}"
    if ip.is_multicast:
        return "a multicast address"
    if not ip.is_global:  # loopback, private, link-local, shared, reserved, unspecified, ...
        return ("a loopback address" if ip.is_loopback else "a link-local address" if ip.is_link_local
                else "an unspecified address" if ip.is_unspecified else "a private address" if ip.is_private
                else "a non-public address")
    return None


def system_resolver(host: str, port: int) -> list[str]:
    """Every address of `host` (IP literals and the forms inet_aton accepts, such as 2130706433,
    come back as themselves)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def resolve_within(resolver: Resolver, host: str, port: int, seconds: float | None) -> list[str]:
    """`resolver(host, port)`, given at most `seconds` (None: no bound); TimeoutError past it. The
    call runs in a daemon thread, left to finish on its own when abandoned."""
    if seconds is None:
        return list(resolver(host, port))
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["addresses"] = list(resolver(host, port))
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            box["error"] = error

    thread = threading.Thread(target=run, name="media-url-resolve", daemon=True)
    thread.start()
    thread.join(max(0.0, seconds))
    if thread.is_alive():
        raise TimeoutError(f"resolving {host} took longer than the fetch's deadline")
    if "error" in box:
        raise box["error"]
    return box["addresses"]


def public_addresses(host: str, port: int, resolver: Resolver = system_resolver,
                     seconds: float | None = None) -> list[str]:
    """The host's addresses if every one of them is public; raises MediaURLRefused otherwise."""
    try:
        addresses = resolve_within(resolver, host, port, seconds)
    except TimeoutError:
        raise
    except (OSError, UnicodeError):
        addresses = []
    # One message for "does not resolve" and "is not public": no oracle on internal names.
    if not addresses or any(address_problem(a) for a in addresses):
        raise refused(host, "the host is not on a public address")
    return addresses


def _hostname(parts: urllib.parse.SplitResult) -> str:
    return (parts.hostname or "").rstrip(".")


class _Deadline:
    """The one deadline of a fetch; every blocking socket call gets the time left as its timeout."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise TimeoutError("the fetch's deadline passed")
        return left


class _DeadlineCalls:
    """Every receive and send of a socket waits at most until the fetch's deadline: the timeout is
    set to the time left before each call (http.client reads the status line, the headers, chunk
    sizes and the body through recv_into)."""

    deadline: _Deadline

    def recv_into(self, *args: Any, **kwargs: Any) -> int:
        self.settimeout(self.deadline.left())
        return super().recv_into(*args, **kwargs)

    def recv(self, *args: Any, **kwargs: Any) -> bytes:
        self.settimeout(self.deadline.left())
        return super().recv(*args, **kwargs)

    def sendall(self, *args: Any, **kwargs: Any) -> None:
        self.settimeout(self.deadline.left())
        return super().sendall(*args, **kwargs)


class _DeadlineSocket(_DeadlineCalls, socket.socket):
    """A TCP socket bounded by the fetch's deadline."""


class _DeadlineSSLSocket(_DeadlineCalls, ssl.SSLSocket):
    """The same for TLS: CPython's ssl module applies a socket's timeout to a whole read, write or
    handshake call, so setting it to the time left before each call bounds the fetch."""

    def read(self, *args: Any, **kwargs: Any) -> Any:
        self.settimeout(self.deadline.left())
        return super().read(*args, **kwargs)

    def do_handshake(self, *args: Any, **kwargs: Any) -> None:
        self.settimeout(self.deadline.left())
        return super().do_handshake(*args, **kwargs)


def _connect(address: str, port: int, deadline: _Deadline) -> _DeadlineSocket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = _DeadlineSocket(family, socket.SOCK_STREAM)
    sock.deadline = deadline
    try:
        sock.settimeout(deadline.left())
        sock.connect((address, port))
    except BaseException:
        sock.close()
        raise
    return sock


class _Pinned:
    """http.client connections whose socket goes to one given address, whatever the host name, and
    whose every blocking call ends by the fetch's deadline (`timeout` is a `_Deadline` here)."""

    class HTTP(http.client.HTTPConnection):
        def __init__(self, host: str, port: int, address: str, timeout: Any) -> None:
            super().__init__(host, port, timeout=timeout.left() if isinstance(timeout, _Deadline) else timeout)
            self.address, self.deadline = address, timeout

        def connect(self) -> None:
            self.sock = _connect(self.address, self.port, self.deadline)

    class HTTPS(http.client.HTTPSConnection):
        def __init__(self, host: str, port: int, address: str, timeout: Any) -> None:
            context = _tls_context()
            context.sslsocket_class = _DeadlineSSLSocket
            super().__init__(host, port, timeout=timeout.left() if isinstance(timeout, _Deadline) else timeout,
                             context=context)
            self.address, self.deadline = address, timeout

        def connect(self) -> None:
            sock = _connect(self.address, self.port, self.deadline)
            try:
                tls = self._context.wrap_socket(sock, server_hostname=self.host, do_handshake_on_connect=False)
            except BaseException:
                sock.close()
                raise
            tls.deadline = self.deadline
            self.sock = tls
            tls.do_handshake()


def _tls_context() -> ssl.SSLContext:
    try:  # the CA bundle requests and aiohttp use; slim images may lack the system one
        import certifi

        return ssl.create_default_context(cafile=certifi.where())
    except ImportError:
        return ssl.create_default_context()


def _read_limited(response: http.client.HTTPResponse, max_bytes: int, what: str, url: str) -> bytes:
    length = response.getheader("Content-Length")
    if length and length.isdigit() and int(length) > max_bytes:
        raise MediaURLRefused(f"the {what} at the URL is larger than {max_bytes} bytes ({url})")
    chunks, size = [], 0
    while True:
        # read1: what has arrived (at most one receive), so the deadline is looked at between bytes
        # of a trickle, not after 64 KiB of them.
        chunk = response.read1(min(RECV_CHUNK, max_bytes + 1 - size))
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise MediaURLRefused(f"the {what} at the URL is larger than {max_bytes} bytes ({url})")
        chunks.append(chunk)


def fetch(url: str, *, explicit_hosts: Iterable[str] = (), timeout: float | None = 5.0,
          max_bytes: int = DEFAULT_MAX_BYTES, allow_redirects: bool = True,
          resolver: Resolver = system_resolver, connection: Any = _Pinned, what: str = "image") -> bytes:
    """The body of `url`, fetched under the rule of this module's docstring (`what`: the modality,
    for messages). One deadline of `timeout` seconds covers everything; past it MediaURLRefused."""
    seconds = timeout if timeout and timeout > 0 else 5.0
    deadline = _Deadline(seconds)
    try:
        return _fetch(url, explicit_hosts, deadline, max_bytes, allow_redirects, resolver, connection, what)
    except TimeoutError:
        raise MediaURLRefused(f"fetching the {what} URL took longer than {seconds:g} s, this server's limit "
                              f"for {what}s; send the {what} inline as a base64 data: URL ({url[:200]})") from None


def _fetch(url: str, explicit_hosts: Iterable[str], deadline: _Deadline, max_bytes: int, allow_redirects: bool,
           resolver: Resolver, connection: Any, what: str) -> bytes:
    explicit = {h.strip("[]").lower() for h in explicit_hosts}
    for _hop in range(MAX_REDIRECTS + 1):
        parts = urllib.parse.urlsplit(url)
        scheme, host = parts.scheme.lower(), _hostname(parts)
        if scheme not in ("http", "https") or not host:
            raise MediaURLRefused(f"{what} URL refused: only http and https URLs are fetched ({url[:200]})")
        port = parts.port or (443 if scheme == "https" else 80)
        if host.lower() in explicit:  # listed by the operator: fetched as listed
            try:
                addresses = resolve_within(system_resolver, host, port, deadline.left())
            except TimeoutError:
                raise
            except OSError:
                raise MediaURLRefused(f"fetching the {what} URL failed: cannot resolve {host}") from None
        else:
            addresses = public_addresses(host, port, resolver, deadline.left())
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn_class = connection.HTTPS if scheme == "https" else connection.HTTP
        conn = conn_class(host, port, addresses[0], deadline)
        try:
            conn.request("GET", target, headers={"User-Agent": USER_AGENT, "Accept": "image/*,*/*;q=0.5"})
            response = conn.getresponse()
            if response.status in (301, 302, 303, 307, 308) and response.getheader("Location"):
                if not allow_redirects:
                    raise MediaURLRefused(f"the {what} URL redirects, and this server does not follow "
                                          f"redirects (VLLM_MEDIA_URL_ALLOW_REDIRECTS=0) ({url})")
                url = urllib.parse.urljoin(url, response.getheader("Location"))
                continue
            if response.status != 200:
                raise MediaURLRefused(f"fetching the {what} URL failed: HTTP {response.status} ({url})")
            return _read_limited(response, max_bytes, what, url)
        except TimeoutError:
            raise
        except (OSError, http.client.HTTPException) as error:
            deadline.left()  # a failure caused by the deadline (a timed-out TLS read) is a timeout
            raise MediaURLRefused(f"fetching the {what} URL failed: {type(error).__name__} ({url})") from None
        finally:
            conn.close()
    raise MediaURLRefused(f"the {what} URL redirects more than {MAX_REDIRECTS} times")


def max_bytes_for(media_io: Any) -> int:
    """The body limit for one of vLLM's media IOs: `max_bytes_from_env`, never above the IO's own
    `get_max_bytes` (vLLM >= 0.30)."""
    get_max = getattr(media_io, "get_max_bytes", None)
    return max_bytes_from_env(get_max() if get_max else None)


def max_bytes_from_env(media_limit: int | None = None) -> int:
    """The body limit: VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB when the operator set it, else
    DEFAULT_MAX_BYTES; and never more than what vLLM's media loader accepts (`media_limit`)."""
    configured = os.environ.get("VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB", "").strip()
    limit = int(configured) * 1024 * 1024 if configured.isdigit() and int(configured) > 0 else DEFAULT_MAX_BYTES
    return min(limit, media_limit) if media_limit else limit
