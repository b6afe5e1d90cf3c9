"""During the SIGTERM drain: new requests and /health get 503, cut requests a JSON 503."""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any

from ...core.patch import AT_REGISTER, LayoutNotFound, Patch
from ...core.vllm_code import API_SERVER_LAUNCHERS, require_source
from ...core.wrap import wrap_when_imported

NAME = "shutdown-drain-503"
HEALTH_ROUTE = "entrypoints/serve/instrumentator/health.py"  # vLLM 0.23, 0.30 and 0.32
OPEN_PATHS = frozenset({"/metrics"})  # still answered during the drain: scrapes see the shutdown
NEW_REQUEST = ("This server is shutting down and accepts no new requests: send the request to another "
               "instance.")
CUT_REQUEST = ("This server shut down before the request finished (it ran longer than --shutdown-timeout "
               "allows): send it again, to another instance.")
ENGINE_DEAD = "EngineCore encountered an issue"  # vLLM's EngineDeadError message (0.23 - 0.32)


def error_body(message: str) -> bytes:
    """vLLM's error shape (`ErrorResponse`), as its own 503 (queue full) has it."""
    return json.dumps({"error": {"message": message, "type": "ServiceUnavailableError", "param": None,
                                 "code": 503}}).encode()


async def respond_503(send: Any, message: str) -> None:
    body = error_body(message)
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def is_engine_dead(body: bytes) -> bool:
    try:
        return ENGINE_DEAD in json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return False


def is_event_stream(start: Any) -> bool:
    headers = dict(start.get("headers") or []) if start else {}
    return headers.get(b"content-type", b"").startswith(b"text/event-stream")


def cut_stream_events(body: bytes) -> bytes:
    """The stream chunk with vLLM's engine-died error event (`data: {"error": ...500}`) replaced
    by the cut request's 503 event; every other line as it was."""
    lines = body.split(b"\n")
    for index, line in enumerate(lines):
        if line.startswith(b"data: ") and is_engine_dead(line[len(b"data: "):]):
            lines[index] = b"data: " + error_body(CUT_REQUEST)
    return b"\n".join(lines)


class DrainGuard:
    """ASGI wrapper of vLLM's app; `draining` turns True when vLLM starts its drain."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.draining = False

    def watch(self, engine_client: Any) -> None:
        """Turn `draining` on when `serve_http` calls this engine client's `shutdown`."""
        original = engine_client.shutdown

        @functools.wraps(original)
        def shutdown(*args: Any, **kwargs: Any) -> Any:
            self.draining = True
            return original(*args, **kwargs)

        engine_client.shutdown = shutdown

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.draining and scope.get("path") not in OPEN_PATHS:
            await respond_503(send, NEW_REQUEST)
            return
        sent = {"start": None, "held": None, "body": b"", "complete": False}

        async def guarded_send(message: Any) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                if self.draining and message["status"] == 500:
                    sent["held"] = message  # vLLM's engine-died answer to a cut request?
                    return
                sent["start"] = message
            elif kind == "http.response.body" and sent["held"] is not None:
                sent["body"] += message.get("body", b"")
                if message.get("more_body", False):
                    return
                held, body = sent["held"], sent["body"]
                sent["held"], sent["complete"] = None, True
                if is_engine_dead(body):
                    sent["start"] = {"status": 503}
                    await respond_503(send, CUT_REQUEST)
                    return
                sent["start"] = held
                await send(held)
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return
            elif kind == "http.response.body":
                chunk = message.get("body", b"")
                if self.draining and is_event_stream(sent["start"]) and ENGINE_DEAD.encode() in chunk:
                    message = {**message, "body": cut_stream_events(message["body"])}
                if not message.get("more_body", False):
                    sent["complete"] = True
            await send(message)

        try:
            await self.app(scope, receive, guarded_send)
        except asyncio.CancelledError:
            # uvicorn cancels the requests still open after the drain (shutdown-cut-requests).
            if not self.draining or sent["complete"]:
                raise
            if sent["start"] is None:
                await respond_503(send, CUT_REQUEST)
                return
            if not is_event_stream(sent["start"]):
                raise
            event = b"data: " + error_body(CUT_REQUEST) + b"\n\ndata: [DONE]\n\n"
            await send({"type": "http.response.body", "body": event, "more_body": False})


def _load(original: Any) -> Any:
    @functools.wraps(original)
    def load(self: Any) -> None:
        state = getattr(self.app, "state", None)
        engine_client = getattr(state, "engine_client", None) if state is not None else None
        if not self.loaded and engine_client is not None and not isinstance(self.app, DrainGuard):
            guard = DrainGuard(self.app)
            guard.watch(engine_client)
            self.app = guard
        original(self)

    return load


def check(_: Any) -> str | None:
    path, source = require_source(*API_SERVER_LAUNCHERS)
    if "engine_client.shutdown" not in source or "uvicorn.Config(" not in source:
        raise LayoutNotFound(f"vLLM's {path} does not drain through engine_client.shutdown while uvicorn serves")
    health = require_source(HEALTH_ROUTE)
    if any(word in health[1] for word in ("shutdown", "draining", "shutting")):
        return f"vLLM's /health ({HEALTH_ROUTE}) knows about the shutdown"
    return None


def apply(_: Any) -> None:
    # Only processes that import uvicorn (the API server) are affected.
    wrap_when_imported("uvicorn.config", "Config.load", _load)


PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary="during the SIGTERM drain new requests and /health get 503, and cut requests a JSON 503 "
    "(not 500 'cannot schedule new futures after shutdown', 200, or uvicorn's plain-text 500)",
    upstream="vLLM's serve_http keeps serving during engine_client.shutdown(timeout) without refusing "
    "new requests (0.23, 0.30, 0.32; no fix)",
    check=check,
    apply=apply,
    fixes=('during the SIGTERM drain a new request gets 500 "cannot schedule new futures after shutdown" and `/health` '
     f'200; a request cut at the timeout gets uvicorn\'s plain-text 500 or vLLM\'s 500 "{ENGINE_DEAD}" (a race)'),
    tests=('`test_drain_refuses_new_requests_and_answers_cut_ones_with_json_503`, '
     '`test_sigterm_answers_the_cut_request_and_exits_0`; '
     '`tests/test_faults.py::test_overload_then_sigterm_with_requests_in_flight` (503s, exit 0, on 0.32)'),
    delete_when=('vLLM refuses new requests and fails `/health` with 503 during its drain, and answers cut requests in its JSON '
     'shape'),
    details=f"""
an ASGI wrapper around vLLM's app, put in by wrapping
`uvicorn.Config.load` (the `uvicorn.Config.__init__` wrap belongs to `shutdown-cut-requests`).
It switches on when `serve_http` calls the engine client's `shutdown(timeout)` for the drain (the
instance's method is wrapped: no other patch's class-level wrap of `AsyncLLM.shutdown` is
touched). From then on it answers every new request but `/metrics` itself: 503, vLLM's JSON
error shape, `Connection: close`. For the requests in flight it answers uvicorn's cancellation at
the end of the grace with a JSON 503 (a stream that already started: an error event and
`data: [DONE]`, as vLLM ends a stream on an error) and replaces vLLM's 500 "{ENGINE_DEAD}" with the same 503 once the drain has started. Everything else passes
through unchanged. Predicate: the launcher drains through `engine_client.shutdown` while uvicorn
serves, and vLLM's `/health` route (`{HEALTH_ROUTE}`) does not
mention the shutdown. Only the single-API-server path is covered (as `engine-death-exit`).
""",
    evidence={"0.30.0": ('applied', ('`launcher.py:138-160`: the drain is `engine_client.shutdown(timeout)` (:152) while uvicorn '
                         f'serves; `{HEALTH_ROUTE}:23-31` answers 200 unless the engine '
                         'is dead: `/health` 200 and a new request accepted during the drain, the cut requests 500 '
                         'or never answered'))},
)
