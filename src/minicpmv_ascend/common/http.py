"""The one HTTP client of the kit: JSON over HTTP to a vLLM server, with a bounded time per request.

Used by the probe (every few seconds, by orchestrators), the tools (parity, bench, fuzz, the server
lifecycle of the tests and the bench) and scripts/ascend_check.py. Every failure is one
RequestFailed whose message is one line naming the request and what went wrong, in words an
operator can act on ("connection refused: nothing listens on this port yet ...").

Proxies are ignored on purpose: the client talks to the server itself, and an inherited HTTP_PROXY
would otherwise route 127.0.0.1 through a proxy (vLLM's own benchmark client ignores them too).

Standard library only, Python 3.7 or newer (see minicpmv_ascend.common).
"""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

MAX_ERROR_CHARS = 200
READ_CHUNK = 64 * 1024


class RequestFailed(Exception):
    """A request got no usable answer: `request` ("GET /health") and `reason` (one line).

    `status` and `body` are the server's answer when it answered with an HTTP error (else None
    and b"")."""

    def __init__(self, request: str, reason: str, status: int | None = None, body: bytes = b"") -> None:
        self.request, self.reason, self.status, self.body = request, reason, status, body
        super().__init__(f"{request}: {reason}")


@dataclass
class Client:
    """JSON over HTTP to one server (`base_url`: scheme, host and port), `timeout` seconds per
    request (the whole response, not only each read), with the API key as a bearer token."""

    base_url: str
    timeout: float
    api_key: str | None = None
    user_agent: str = "minicpmv-ascend"
    _opener: urllib.request.OpenerDirector = field(
        default_factory=lambda: urllib.request.build_opener(urllib.request.ProxyHandler({})),
        repr=False,
    )

    def get(self, path: str) -> tuple[int, bytes]:
        return self._send("GET", path, None)

    def get_json(self, path: str) -> Any:
        _, body = self._send("GET", path, None)
        return parse_json(body, f"GET {path}")

    def post_json(self, path: str, payload: dict[str, Any]) -> Any:
        _, body = self._send("POST", path, json.dumps(payload).encode("utf-8"))
        return parse_json(body, f"POST {path}")

    def _headers(self, has_body: bool) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": self.user_agent}
        if has_body:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _send(self, method: str, path: str, data: bytes | None) -> tuple[int, bytes]:
        what = f"{method} {path}"
        request = urllib.request.Request(
            self.base_url + path, data=data, method=method, headers=self._headers(data is not None)
        )
        deadline = time.monotonic() + self.timeout
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                return response.status, _read_until(response, deadline, what, self.timeout)
        except urllib.error.HTTPError as exc:
            body = _error_body(exc)
            raise RequestFailed(what, f"HTTP {exc.code} {_server_error(body)}".rstrip(), exc.code, body) from exc
        except urllib.error.URLError as exc:
            raise RequestFailed(what, _describe_os_error(exc.reason, self.timeout)) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise RequestFailed(what, _describe_os_error(exc, self.timeout)) from exc


def _read_until(response: Any, deadline: float, what: str, timeout: float) -> bytes:
    """Read the body in chunks so a server trickling bytes cannot stretch the time limit
    (the socket timeout alone bounds each read, not the whole response)."""
    parts: list[bytes] = []
    while True:  # (no walrus: Python 3.7)
        chunk = response.read(READ_CHUNK)
        if not chunk:
            break
        parts.append(chunk)
        if time.monotonic() > deadline:
            raise RequestFailed(what, f"timed out after {timeout:g} s reading the response")
    return b"".join(parts)


def _describe_os_error(reason: object, timeout: float) -> str:
    # socket.timeout is TimeoutError from Python 3.10 on, a distinct OSError before.
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return f"timed out after {timeout:g} s"
    if isinstance(reason, ConnectionRefusedError):
        # vLLM binds its port at once but listens only when the model is loaded: during the
        # whole start-up (minutes on a cold NPU) a probe sees this, not a timeout.
        return ("connection refused: nothing listens on this port yet (the server is still "
                "starting and loading the model, or it is not running on this host and port)")
    if isinstance(reason, socket.gaierror):
        return f"cannot resolve the host name ({reason.strerror})"
    if isinstance(reason, ConnectionResetError):
        return "connection reset by the server"
    if isinstance(reason, http.client.RemoteDisconnected):
        return "server closed the connection without answering"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return str(reason) or type(reason).__name__


def _error_body(exc: urllib.error.HTTPError) -> bytes:
    try:
        return exc.read()
    except OSError:
        return b""


def _server_error(body: bytes) -> str:
    """The message from vLLM's JSON error body ({"error": {"message": ...}}), shortened."""
    text = body.decode("utf-8", "replace")
    message = text
    try:
        error = json.loads(text).get("error")
        message = error.get("message", text) if isinstance(error, dict) else str(error or text)
    except (ValueError, AttributeError):
        pass
    message = " ".join(message.split())
    return (message[:MAX_ERROR_CHARS] + "...") if len(message) > MAX_ERROR_CHARS else message


def parse_json(body: bytes, what: str) -> Any:
    try:
        return json.loads(body)
    except ValueError as exc:
        raise RequestFailed(what, f"response is not JSON ({exc})") from exc
