"""What a request body may be before vLLM parses it: at most `max_request_body_mb`, and no string
the engine cannot encode.

Why: vLLM (0.23, 0.30, 0.32) reads a body of any size into memory and parses it (a 30 MB body of
whitespace is parsed and served). And JSON can spell a lone UTF-16 surrogate (`"\\ud800"`, valid
JSON, not valid Unicode text): Python keeps it in the `str`, and vLLM fails only when the string
is encoded, far from where it came in: `stop`, `bad_words`, `vllm_xargs`, `chat_template_kwargs`
(and any other field that reaches the engine or the tokenizer) give `500 InternalServerError` with
an empty message (`UnicodeEncodeError ... surrogates not allowed` in `vllm/v1/serial_utils.py`, or
`TypeError: TextEncodeInput` in the tokenizer), streamed as a 200 whose stream carries the error.

How: `RequestGuard` is a dependency-free ASGI middleware the launcher hands vLLM through its
`--middleware` option, inside the access control (an unauthenticated request is refused before
its body is read) and outside the tool-call guard:
1. a body over the limit answers 413 at once (Content-Length), or as soon as the bytes received
   pass it (chunked uploads), without reading further;
2. a body that spells a surrogate escape (`\\uD800`-`\\uDFFF`, a fast byte search; nothing else
   is parsed here) is parsed as JSON, and every string (and key) that is not valid Unicode, i.e.
   holds a surrogate that is not half of a pair, makes a 400 that names the field
   (`stop[0]`, `messages[0].content[1].text`): one general check at the door instead of one per
   field, the same on every vLLM target. Pairs (`"\\ud83d\\ude00"`, an emoji) are one character
   once parsed and pass unchanged, as does every other body: it is handed on byte for byte.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MIDDLEWARE = f"{__name__}.RequestGuard"
LIMIT_ENV = "MAX_REQUEST_BODY_MB"
# 160 MiB: five images at OpenAI's 20 MiB limit, base64-encoded (x 4/3: 134 MiB), plus the rest of
# a request; no honest request is larger (limit_mm_per_prompt allows 5 images), and a server that
# reads at most this much per request cannot be made to hold gigabytes by one client.
DEFAULT_LIMIT_MB = 160
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def limit_from_env() -> int:
    """The body limit in bytes (MAX_REQUEST_BODY_MB, the launcher sets it)."""
    configured = os.environ.get(LIMIT_ENV, "").strip()
    megabytes = int(configured) if configured.isdigit() and int(configured) > 0 else DEFAULT_LIMIT_MB
    return megabytes * 1024 * 1024


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def unencodable_fields(value: Any, path: str = "") -> list[str]:
    """The paths of the strings (and keys) in a parsed JSON value that are not valid Unicode."""
    found: list[str] = []
    if isinstance(value, str):
        if not _encodable(value):
            found.append(path or "(the body)")
    elif isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if not _encodable(key):
                found.append(f"{path or '(the body)'} (a key)")
                where = f"{path}.<key>" if path else "<key>"
            found.extend(unencodable_fields(item, where))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found.extend(unencodable_fields(item, f"{path}[{i}]"))
    return found


def body_problem(body: bytes) -> tuple[str, str] | None:
    """(field, message) when the body holds text the engine cannot encode, else None."""
    if not SURROGATE_ESCAPE.search(body):
        return None
    try:
        parsed = json.loads(body)
    except ValueError:
        return None  # not JSON: vLLM answers it
    fields = unencodable_fields(parsed)
    if not fields:
        return None  # only surrogate pairs: valid text
    return fields[0], (
        f"`{fields[0]}` holds a lone UTF-16 surrogate (an escape such as \\ud800 that is not half of a "
        f"pair), which is not Unicode text and cannot be encoded"
        + (f" (also in {', '.join(f'`{f}`' for f in fields[1:4])})" if len(fields) > 1 else "")
        + "; send valid UTF-8 text: a character outside the Basic Multilingual Plane is either the "
        "character itself or both halves of its surrogate pair (\\ud83d\\ude00)")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def _send_error(send: Send, status: int, kind: str, message: str, param: str | None) -> None:
    data = json.dumps({"error": {"message": message, "type": kind, "param": param, "code": status}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": data})


class RequestGuard:
    """The ASGI middleware (module docstring)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], limit: int | None = None) -> None:
        self.app = app
        self.limit = limit if limit is not None else limit_from_env()

    def _too_large(self) -> str:
        return (f"the request body is larger than this server accepts ({self.limit // (1024 * 1024)} MiB, "
                f"{LIMIT_ENV}); send fewer or smaller images, or fetch them by URL")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        length = _header(scope, b"content-length")
        if length and length.strip().isdigit() and int(length) > self.limit:
            await _send_error(send, 413, "RequestEntityTooLarge", self._too_large(), None)
            return
        messages: list[Message] = []
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            part = message.get("body", b"")
            size += len(part)
            if size > self.limit:
                await _send_error(send, 413, "RequestEntityTooLarge", self._too_large(), None)
                return
            parts.append(part)
            if not message.get("more_body", False):
                break
        problem = body_problem(b"".join(parts))
        if problem is not None:
            await _send_error(send, 400, "BadRequestError", problem[1], problem[0])
            return
        pending = iter(messages)

        async def replay() -> Message:
            return next(pending, None) or await receive()

        await self.app(scope, replay, send)
