"""Requests cut by the shutdown timeout get an answer, and the server exits, instead of hanging.

Bug (vLLM 0.23 and 0.32): on SIGTERM, vLLM's `serve_http` calls
`engine_client.shutdown(timeout=--shutdown-timeout)`: the engine drains, is killed at the timeout,
and `AsyncLLM.shutdown()` then cancels the output handler. The requests still running wait on
their output queues, which nothing fills any more, unless the output handler saw the engine die
before it was cancelled (a race: 1 run in 6 here, those got 500 "EngineCore encountered an
issue"). vLLM then stops uvicorn, whose `Server.shutdown()` waits for every open connection with
`timeout_graceful_shutdown=None`: no limit. vLLM builds `uvicorn.Config` without that option and
ignores a second SIGTERM (its handler returns once shutdown started; its server class disables
uvicorn's own signal handling), so the process exits only when the last cut client gives up, or at
the orchestrator's SIGKILL.

Fix: `uvicorn.Config` gets `timeout_graceful_shutdown` (GRACE_S) when the caller did not set it.
uvicorn then cancels the requests still open GRACE_S after vLLM's drain ended (the engine is gone
by then: nothing can complete them) and answers each with 500; the server exits 0 right after.
Requests that finish within --shutdown-timeout are untouched: the grace starts after the drain.

Applies when: vLLM's launcher does not set `timeout_graceful_shutdown` (read from its source).
Delete when: vLLM bounds uvicorn's graceful shutdown or fails the cut requests itself.
"""

from __future__ import annotations

import functools
from typing import Any

from ._base import API_SERVER_LAUNCHERS, AT_REGISTER, Patch, source_of, wrap_once
from ._import_hook import when_imported

NAME = "shutdown-cut-requests"
GRACE_S = 3  # after vLLM's drain; long enough for responses already being written


def _init(original: Any) -> Any:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("timeout_graceful_shutdown") is None:
            kwargs["timeout_graceful_shutdown"] = GRACE_S
        original(self, *args, **kwargs)

    return __init__


def check(_: Any) -> str | None:
    found = source_of(*API_SERVER_LAUNCHERS)
    if found is None:
        return "vLLM has no API server launcher module here"
    path, source = found
    if "uvicorn.Config(" not in source:
        return f"vLLM's {path} does not build uvicorn.Config"
    if "timeout_graceful_shutdown" in source:
        return f"vLLM's {path} sets timeout_graceful_shutdown itself"
    return None


def apply(_: Any) -> None:
    # Only processes that import uvicorn (the API server) are affected.
    when_imported("uvicorn.config", lambda module: wrap_once(module.Config, "__init__", _init))


PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary=f"uvicorn timeout_graceful_shutdown={GRACE_S}s: requests cut by --shutdown-timeout get "
    "500 and the server exits, instead of waiting for their clients",
    upstream="vLLM's serve_http builds uvicorn.Config without timeout_graceful_shutdown (0.23-0.33)",
    check=check,
    apply=apply,
)
