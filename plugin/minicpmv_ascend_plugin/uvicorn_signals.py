"""vLLM 0.23: uvicorn must not start its own shutdown on SIGTERM (backport of vLLM #50916).

Bug (vLLM 0.23 with uvicorn >= 0.29, i.e. any current `fastapi[standard]`): vLLM's `serve_http`
registers its own SIGTERM/SIGINT handlers on the event loop (drain the engine for
--shutdown-timeout, then stop uvicorn), but runs a plain `uvicorn.Server`, whose `serve()` also
installs uvicorn's handlers (`Server.capture_signals`). On SIGTERM both run: vLLM starts its
drain, and uvicorn starts its own shutdown at once: it closes the listening socket (new requests
and /health get "connection refused" during the whole drain) and waits for the requests in
flight only `timeout_graceful_shutdown` long. With the plugin's `shutdown-cut-requests` (3 s)
every request still running 3 s after SIGTERM is cancelled, whatever --shutdown-timeout says
(measured on vLLM 0.23's own server loop: a 10 s drain cut its requests after 3 s). Upstream:
vLLM #49668 (ordering) and #50916 (a uvicorn.Server subclass with a no-op `capture_signals`,
`NoSignalServer`, in vLLM 0.30 and 0.32).

Fix: the same as #50916: `uvicorn.Server.capture_signals` does nothing in vLLM's API server
process (vLLM's own handlers stop the server, as on 0.30 and 0.32). Applied when vLLM's launcher
module is imported; no other uvicorn server runs in that process.

Applies when: vLLM's launcher registers its own SIGTERM handler with `loop.add_signal_handler`
and runs `uvicorn.Server(...)` without overriding `capture_signals` (read from its source).
Delete when: vLLM's launcher disables uvicorn's signal handlers itself (vLLM 0.30 and 0.32 do).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ._base import API_SERVER_LAUNCHERS, AT_REGISTER, Patch, source_of, wrap_once
from ._import_hook import when_imported

NAME = "uvicorn-signals"
LAUNCHER_MODULES = ("vllm.entrypoints.launchers.launcher", "vllm.entrypoints.launcher")  # 0.32, 0.23


def _capture_signals(original: Any) -> Any:
    @contextlib.contextmanager
    def capture_signals(self: Any) -> Iterator[None]:
        yield  # vLLM's loop.add_signal_handler handlers own SIGTERM/SIGINT

    return capture_signals


def check(_: Any) -> str | None:
    found = source_of(*API_SERVER_LAUNCHERS)
    if found is None:
        return "vLLM has no API server launcher module here"
    path, source = found
    if "add_signal_handler(signal.SIGTERM" not in source:
        return f"vLLM's {path} leaves SIGTERM to uvicorn"
    if "def capture_signals" in source or "uvicorn.Server(config" not in source:
        return f"vLLM's {path} runs a uvicorn server without uvicorn's signal handlers (vLLM #50916)"
    return None


def apply(_: Any) -> None:
    def disable(_launcher: Any) -> None:
        import uvicorn.server

        wrap_once(uvicorn.server.Server, "capture_signals", _capture_signals)

    for name in LAUNCHER_MODULES:  # only the API server imports vLLM's launcher
        when_imported(name, disable)


PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary="uvicorn installs no SIGTERM/SIGINT handlers in vLLM's API server: vLLM's drain runs with "
    "the port open and is not cut 3 s after SIGTERM (backport of vLLM #50916)",
    upstream="vLLM #50916 (NoSignalServer; #49668), in 0.30 and 0.32",
    check=check,
    apply=apply,
)
