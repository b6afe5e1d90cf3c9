"""vLLM 0.23: uvicorn must not start its own shutdown on SIGTERM (backport of vLLM #50916)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ...core.import_hook import when_imported
from ...core.patch import AT_REGISTER, Patch
from ...core.vllm_code import API_SERVER_LAUNCHERS, require_source
from ...core.wrap import wrap_once

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
    tests=('`test_drain_is_cut_after_3_s_without_uvicorn_signals`, '
     "`test_drain_refuses_new_requests_and_answers_cut_ones_with_json_503` (on 0.30, vLLM's own `NoSignalServer` "
     'keeps the port open)'),
    delete_when='vLLM >= 0.30',
    details="""
vLLM 0.23's `serve_http` registers SIGTERM/SIGINT handlers with
`loop.add_signal_handler` and runs a plain `uvicorn.Server`, whose `serve()` installs uvicorn's
own (`capture_signals`, uvicorn >= 0.29). Both run on SIGTERM: vLLM drains, and uvicorn starts
its shutdown at once (closes the port, waits `timeout_graceful_shutdown`, cancels the requests).
The patch is vLLM #50916: `uvicorn.Server.capture_signals` does nothing in the process that
imports vLLM's launcher (the API server). Predicate: the launcher source registers SIGTERM with
`add_signal_handler(signal.SIGTERM` and builds `uvicorn.Server(config` without a
`capture_signals` of its own. vLLM 0.30 already runs `NoSignalServer`
(`entrypoints/launchers/launcher.py:38-47`): not applied there.
""",
    evidence={"0.30.0": ('not needed', ('`entrypoints/launchers/launcher.py:38-47` `NoSignalServer` (vLLM #50916), `:100` `server = '
                         'NoSignalServer(config)`: the drain without the plugin keeps the port open and is not cut '
                         'at 3 s'))},
)
