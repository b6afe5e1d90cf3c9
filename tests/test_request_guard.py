"""The request guard (src/minicpmv_ascend/request_guard.py): text the engine cannot encode gets a
400 naming the field, in every field, streamed or not, while valid text passes unchanged; a body
past max_request_body_mb gets 413 before it is read.

Before (vLLM 0.32, the shared server without the guard): `"\\ud800"` in stop (chat, completions),
bad_words, vllm_xargs, chat_template_kwargs -> 500 InternalServerError with an empty message
(streamed: a 200 whose stream carries the 500); docs/reliability.md has the table.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from minicpmv_ascend.server import request_guard
from support import raw_http

LONE = "\ud800"  # json.dumps (ensure_ascii) sends it as the escape \ud800: valid JSON, not Unicode text
VALID = ["中文", "😀", "é"]  # 😀 goes out as the escaped pair \ud83d\ude00


def cases(model: str, text: Any) -> dict[str, tuple[str, dict[str, Any]]]:
    """field -> (path, body) with `text` in that field; each field reaches the engine or tokenizer."""
    messages = [{"role": "user", "content": "Hello"}]
    chat = {"model": model, "messages": messages, "max_tokens": 2}
    return {
        "stop[0]": ("/v1/chat/completions", chat | {"stop": [text]}),
        "stop": ("/v1/completions", {"model": model, "prompt": "Hello", "max_tokens": 2, "stop": text}),
        "bad_words[0]": ("/v1/chat/completions", chat | {"bad_words": [text]}),
        "vllm_xargs.tag": ("/v1/chat/completions", chat | {"vllm_xargs": {"tag": text}}),
        "chat_template_kwargs.note": ("/v1/chat/completions", chat | {"chat_template_kwargs": {"note": text}}),
        "messages[0].content": ("/v1/chat/completions", chat | {"messages": [{"role": "user", "content": text}]}),
        "input": ("/v1/responses", {"model": model, "input": text, "max_output_tokens": 16}),
    }


def post(base_url: str, path: str, body: bytes) -> tuple[int, bytes]:
    return raw_http.send(base_url + path, body)


@pytest.mark.server
def test_a_lone_surrogate_in_any_field_is_a_400_naming_it_and_valid_text_passes(server):
    for field, (path, body) in cases(server.model, LONE).items():
        for stream in (False, True):
            if stream:
                body = body | {"stream": True}
            status, answer = post(server.base_url, path, json.dumps(body).encode("ascii"))
            assert status == 400, (field, stream, status, answer[:300])
            error = json.loads(answer)["error"]
            assert error["param"] == field and f"`{field}`" in error["message"], (field, error)
            assert "lone UTF-16 surrogate" in error["message"] and "\\ud83d\\ude00" in error["message"]
    for text in VALID:
        for field, (path, body) in cases(server.model, text).items():
            # both as ASCII JSON (escapes, the emoji as a surrogate pair) and as raw UTF-8
            for data in (json.dumps(body).encode("ascii"), json.dumps(body, ensure_ascii=False).encode()):
                status, answer = post(server.base_url, path, data)
                assert status == 200, (field, text, status, answer[:300])


def test_check_body_finds_lone_surrogates_only():
    assert request_guard.check_body(b'{"stop": ["\\ud83d\\ude00", "\\u4e2d"]}')[0] is None  # a pair, CJK
    assert request_guard.check_body(b'{"stop": ["\\\\ud800"]}')[0] is None  # an escaped backslash: text
    assert request_guard.check_body(b'not json \\ud800')[0] is None  # vLLM answers what is not JSON
    nested = b'{"user": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # past Python's parser: vLLM's 400 too
    assert request_guard.check_body(nested) == (None, nested)
    for body, field in ((b'{"stop": ["ok", "\\ud800"]}', "stop[1]"), (b'{"a": {"b": "x\\udfff"}}', "a.b"),
                        (b'{"s": "\\ude00\\ud83d"}', "s"), (b'["\\uD800"]', "[0]"), (b'{"k\\ud800": 1}', "(the body) (a key)")):
        problem = request_guard.check_body(body)[0]
        assert problem is not None and problem[0] == field, (body, problem)


def run_guard(limit: int, chunks: list[bytes], headers: list[tuple[bytes, bytes]] = ()) -> tuple[int, bytes, bytes]:
    """One request through RequestGuard in front of an echoing ASGI app: (status, body, what the app read)."""
    seen: list[bytes] = []

    async def app(scope, receive, send):
        while True:
            message = await receive()
            seen.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def main() -> tuple[int, bytes]:
        pending = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
        sent: list[dict] = []

        async def receive():
            return pending.pop(0) if pending else {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": list(headers)}
        await request_guard.RequestGuard(app, limit=limit)(scope, receive, send)
        return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])

    status, body = asyncio.run(main())
    return status, body, b"".join(seen)


def test_bodies_past_the_limit_get_413_before_the_app_and_others_pass_byte_for_byte():
    status, body, seen = run_guard(10, [b"x" * 5], [(b"content-length", b"11")])
    assert status == 413 and b"MAX_REQUEST_BODY_MB" in body and seen == b""
    status, body, seen = run_guard(10, [b"x" * 6, b"y" * 6])  # chunked: cut when the bytes pass it
    assert status == 413 and seen == b""
    chunks = [b'{"stop": ["\\ud83d', b'\\ude00"], ', b'"x": "  "}']
    assert run_guard(100, chunks) == (200, b"ok", b"".join(chunks))


@pytest.mark.server
def test_a_body_past_the_limit_gets_413_before_it_is_sent(server):
    """Only the headers and 1 KiB of a body that says it is 161 MiB: 413 at once, naming the setting."""
    import socket

    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % (161 * 1024 * 1024) + b" " * 1024)
        answer = b""
        while chunk := sock.recv(65536):  # headers and body may come in separate segments; it closes
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    assert b"MAX_REQUEST_BODY_MB" in answer and b"160 MiB" in answer
