"""The tests' raw HTTP request: any method, body bytes and content type, and every answer returned
as (status, body), a 4xx/5xx included. (Named raw_http, not http: the tests that use it also
import the standard library's http.client and http.server.)

Why not minicpmv_ascend.common.http.Client (which the tools, the probe and the server lifecycle
use, and which the tests use wherever a 2xx JSON answer is the claim): it sends only JSON with its
own headers and turns every non-2xx answer into RequestFailed; the bad-request, fuzz-finding,
sweep, security and guard tests send bodies it cannot send (not JSON, other content types, other
methods) and assert on the exact error status and body.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from minicpmv_ascend.common.http import Client, RequestFailed


def send(url: str, body: Any = None, *, method: str | None = None, key: str | None = None,
         content_type: str = "application/json", timeout: float = 120) -> tuple[int, bytes]:
    """`body`: None (no body), bytes (sent as they are) or anything else (sent as JSON)."""
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": content_type} | ({"Authorization": f"Bearer {key}"} if key else {})
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def healthy(base_url: str, timeout: float = 10) -> bool:
    """/health answers 200 (through the kit's own client)."""
    try:
        return Client(base_url, timeout).get("/health")[0] == 200
    except RequestFailed:
        return False


def error_message(body: bytes) -> str:
    """vLLM's OpenAI-shaped {"error": {"message": ...}}, or FastAPI's {"detail": ...}."""
    answer = json.loads(body)
    if "error" in answer:
        return answer["error"]["message"]
    return str(answer["detail"])
