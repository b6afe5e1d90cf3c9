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

from ._base import API_SERVER_LAUNCHERS, AT_REGISTER, Patch, require_source, wrap_once
from ._import_hook import when_imported

NAME = "uvicorn-signals"
LAUNCHER_MODULES = ("vllm.entrypoints.launchers.launcher", "vllm.entrypoints.launcher")  # 0.32, 0.23


def _capture_signals(original: Any) -> Any:
    @contextlib.contextmanager
    def capture_signals(self: Any) -> Iterator[None]:
        yield  # vLLM's loop.add_signal_handler handlers own SIGTERM/SIGINT

    return capture_signals


def check(_: Any) -> str | None:
    path, source = require_source(*API_SERVER_LAUNCHERS)
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


# plugin/README.md's "Details and evidence" for this patch (Markdown; scripts/patch_table.py renders it).
DETAILS = r"""
vLLM 0.23's `serve_http` registers SIGTERM/SIGINT handlers with
`loop.add_signal_handler` and runs a plain `uvicorn.Server`, whose `serve()` installs uvicorn's
own (`capture_signals`, uvicorn >= 0.29). Both run on SIGTERM: vLLM drains, and uvicorn starts
its shutdown at once (closes the port, waits `timeout_graceful_shutdown`, cancels the requests).
The patch is vLLM #50916: `uvicorn.Server.capture_signals` does nothing in the process that
imports vLLM's launcher (the API server). Predicate: the launcher source registers SIGTERM with
`add_signal_handler(signal.SIGTERM` and builds `uvicorn.Server(config` without a
`capture_signals` of its own. vLLM 0.30 already runs `NoSignalServer`
(`entrypoints/launchers/launcher.py:38-47`): not applied there.
"""

PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary="uvicorn installs no SIGTERM/SIGINT handlers in vLLM's API server: vLLM's drain runs with "
    "the port open and is not cut 3 s after SIGTERM (backport of vLLM #50916)",
    upstream="vLLM #50916 (NoSignalServer; #49668), in 0.30 and 0.32",
    check=check,
    apply=apply,
    fixes=("vLLM 0.23 only: uvicorn's own SIGTERM handler runs next to vLLM's: the port closes at once and, with "
     "`shutdown-cut-requests`' 3 s grace, requests are cut 3 s after SIGTERM whatever `--shutdown-timeout` says"),
    references='vLLM #49668, #50916 (`NoSignalServer`, in 0.30 and 0.32)',
    tests=('`test_drain_is_cut_after_3_s_without_uvicorn_signals`, '
     "`test_drain_refuses_new_requests_and_answers_cut_ones_with_json_503` (on 0.30, vLLM's own `NoSignalServer` "
     'keeps the port open)'),
    delete_when='vLLM >= 0.30',
    details=DETAILS,
    evidence={"0.30.0": ('not needed', ('`entrypoints/launchers/launcher.py:38-47` `NoSignalServer` (vLLM #50916), `:100` `server = '
                         'NoSignalServer(config)`: the drain without the plugin keeps the port open and is not cut '
                         'at 3 s'))},
)
