"""Requests cut by the shutdown timeout get an answer, and the server exits, instead of hanging."""

from __future__ import annotations

import functools
from typing import Any

from ...core.patch import AT_REGISTER, LayoutNotFound, Patch
from ...core.vllm_code import API_SERVER_LAUNCHERS, require_source
from ...core.wrap import wrap_when_imported

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
    path, source = require_source(*API_SERVER_LAUNCHERS)
    if "uvicorn.Config(" not in source:
        raise LayoutNotFound(f"vLLM's {path} does not build uvicorn.Config")
    if "timeout_graceful_shutdown" in source:
        return f"vLLM's {path} sets timeout_graceful_shutdown itself"
    return None


def apply(_: Any) -> None:
    # Only processes that import uvicorn (the API server) are affected.
    wrap_when_imported("uvicorn.config", "Config.__init__", _init)


PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary=f"uvicorn timeout_graceful_shutdown={GRACE_S}s: requests cut by --shutdown-timeout get "
    "500 and the server exits, instead of waiting for their clients",
    upstream="vLLM's serve_http builds uvicorn.Config without timeout_graceful_shutdown (0.23-0.33)",
    check=check,
    apply=apply,
    fixes=('requests cut by `--shutdown-timeout` usually get no answer, and the server exits only when their clients give '
     'up (or at SIGKILL); a second SIGTERM is ignored'),
    tests=('`test_sigterm_answers_the_cut_request_and_exits_0`; '
     '`tests/test_faults.py::test_overload_then_sigterm_with_requests_in_flight` (every request answered, exit 0 '
     'within the bound, on 0.32)'),
    delete_when="vLLM bounds uvicorn's graceful shutdown or fails the cut requests itself",
    details=f"""
why they hang: on SIGTERM, `serve_http` runs
`engine_client.shutdown(timeout)`; at the timeout the engine is killed and `AsyncLLM.shutdown()`
cancels the output handler, so requests still waiting on their output queues are never failed
unless the handler saw the engine die first (a race). vLLM then stops uvicorn, whose
`Server.shutdown()` waits for open connections without a limit (`timeout_graceful_shutdown=None`);
vLLM's signal handler returns at once on a second signal and its `NoSignalServer` (0.30, 0.32)
disables uvicorn's own forced exit. The patch gives `uvicorn.Config` `timeout_graceful_shutdown={GRACE_S}` when the
caller did not set one: {GRACE_S} s after the drain uvicorn cancels the remaining request tasks
(`shutdown-drain-503` answers each with a JSON 503; uvicorn alone would send its plain-text 500)
and the server exits 0. Requests that finish within `--shutdown-timeout` are unaffected (the
grace starts after the drain; on vLLM 0.23 only with `uvicorn-signals`, without which uvicorn
starts its own shutdown, and this grace, at SIGTERM). Predicate: vLLM's launcher source builds
`uvicorn.Config(` and never mentions `timeout_graceful_shutdown`.
""",
    evidence={"0.30.0": ('applied', ('`launcher.py:95`: `uvicorn.Config(app, **uvicorn_kwargs)`, no `timeout_graceful_shutdown` '
                         'in the module; `NoSignalServer` (:38-47) keeps uvicorn from handling signals; '
                         '`handle_shutdown` (:138-160) stops the engine, then uvicorn waits for open connections: '
                         'still running 30 s after SIGTERM without the plugin'))},
)
