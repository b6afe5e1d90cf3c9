"""Bad requests against the real vLLM CPU server (the shared `server` fixture).

CASES is the one table of what is sent and what must come back: a 4xx with a word of a useful
message, or, where vLLM serves the request, a documented and bounded behaviour. After EVERY case
the server must still be healthy: /health 200, and a normal text and a normal image request
succeed. CASES and docs/reliability.md's "Bad requests" table generated from them are in
tests/support/bad_requests.py (`make docs` writes the table; tests/test_doc_tables.py keeps it in
sync).
"""

from __future__ import annotations

import json
import time

import pytest

from support import raw_http
from support.bad_requests import CASES, TIMEOUT_S, Case, chat, image_parts
from support.images import png_url
from support.raw_http import error_message

# ------------------------------------------------------------------ sending


def send(base_url: str, case: Case, model: str) -> tuple[int, bytes, float]:
    start = time.monotonic()
    status, body = raw_http.send(base_url + case.path, case.body(model) if case.method == "POST" else None,
                             method=case.method, content_type=case.content_type, timeout=TIMEOUT_S)
    return status, body, time.monotonic() - start


def assert_healthy(base_url: str, model: str) -> None:
    """/health 200, and a normal text and a normal image request are served."""
    assert raw_http.healthy(base_url)
    for content in ("What is 2+3?", image_parts(png_url(96, 64))):
        normal = Case("normal", "", lambda m, c=content: chat(m, c), 200, "")
        status, body, _ = send(base_url, normal, model)
        assert status == 200, body[:300]
        assert json.loads(body)["choices"][0]["finish_reason"] in ("stop", "length")


# ------------------------------------------------------------------ tests


@pytest.mark.server
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_request_gets_its_status_and_message_and_the_server_stays_healthy(server, case: Case):
    status, body, seconds = send(server.base_url, case, server.model)
    print(f"\n{case.name}: HTTP {status} in {seconds:.2f} s: {body[:160]!r}")
    assert status == case.status, body[:500]
    if status == 200:
        answer = json.loads(body)
        assert answer["object"] == case.says
        assert answer["choices"][0]["finish_reason"] in ("stop", "length")
    else:
        message = error_message(body)
        assert case.says.lower() in message.lower(), message
        if b'"error"' in body:  # vLLM's own errors carry the status too
            assert json.loads(body)["error"]["code"] == status
    assert_healthy(server.base_url, server.model)


def test_at_least_15_kinds():
    assert len(CASES) >= 15 and len({c.name for c in CASES}) == len(CASES)
