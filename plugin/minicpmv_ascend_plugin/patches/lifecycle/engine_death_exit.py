"""The API server exits with code 1, not 0, when it stops because its engine died."""

from __future__ import annotations

import ast
import functools
from typing import Any

from ...core.patch import AT_REGISTER, LayoutNotFound, Patch
from ...core.vllm_code import API_SERVER_LAUNCHERS, require_source
from ...core.wrap import emit, wrap_when_imported

NAME = "engine-death-exit"
EXIT_CODE = 1
# Modules holding `terminate_if_errored`: vLLM's launcher (0.32, 0.23) and the exception handlers
# that imported it by name (0.32, 0.23).
TERMINATE_MODULES = (
    "vllm.entrypoints.launchers.launcher",
    "vllm.entrypoints.launcher",
    "vllm.entrypoints.serve.exception_handling.handlers.vllm_error",
    "vllm.entrypoints.serve.utils.server_utils",
)
# Modules holding `run_server`: where vLLM defines it (0.32, 0.23) and `vllm serve`'s module.
RUN_SERVER_MODULES = (
    "vllm.entrypoints.launchers.api_server.entry",
    "vllm.entrypoints.openai.api_server",
    "vllm.entrypoints.cli.serve",
)
ENGINE_CLIENT_MODULE = "vllm.v1.engine.async_llm"

state = {"stop_requested": False, "engine_died": False}


def _terminate_if_errored(original: Any) -> Any:
    @functools.wraps(original)
    def terminate_if_errored(server: Any, engine: Any) -> None:
        stopping = getattr(server, "should_exit", False)
        original(server=server, engine=engine)
        if not stopping and getattr(server, "should_exit", False) and not state["stop_requested"]:
            if not state["engine_died"]:
                emit(f"minicpmv_ascend_plugin: the engine died: the API server stops and will exit "
                     f"with code {EXIT_CODE} ({NAME})")
            state["engine_died"] = True

    return terminate_if_errored


def _run_server(original: Any) -> Any:
    @functools.wraps(original)
    async def run_server(*args: Any, **kwargs: Any) -> None:
        await original(*args, **kwargs)
        if state["engine_died"]:
            raise SystemExit(EXIT_CODE)

    return run_server


def _shutdown(original: Any) -> Any:
    @functools.wraps(original)
    def shutdown(self: Any, *args: Any, **kwargs: Any) -> Any:
        state["stop_requested"] = True
        return original(self, *args, **kwargs)

    return shutdown


def check(_: Any) -> str | None:
    path, source = require_source(*API_SERVER_LAUNCHERS)
    function = next((node for node in ast.walk(ast.parse(source))
                     if isinstance(node, ast.FunctionDef) and node.name == "terminate_if_errored"), None)
    if function is None:
        raise LayoutNotFound(f"vLLM's {path} has no terminate_if_errored")
    assigned = {target.attr for node in ast.walk(function) if isinstance(node, ast.Assign)
                for target in node.targets if isinstance(target, ast.Attribute)}
    does_more = any(isinstance(node, (ast.Raise, ast.Call)) and "exit" in ast.unparse(node).lower()
                    and "should_exit" not in ast.unparse(node) for node in ast.walk(function))
    if assigned != {"should_exit"} or does_more:
        return f"vLLM's terminate_if_errored ({path}) does more than set should_exit"
    return None


def apply(_: Any) -> None:
    for name in TERMINATE_MODULES:
        wrap_when_imported(name, "terminate_if_errored", _terminate_if_errored)
    for name in RUN_SERVER_MODULES:
        wrap_when_imported(name, "run_server", _run_server)
    wrap_when_imported(ENGINE_CLIENT_MODULE, "AsyncLLM.shutdown", _shutdown)


PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary=f"the API server exits {EXIT_CODE} (not 0) when it stopped because its engine died",
    upstream="vLLM's terminate_if_errored only stops uvicorn: `vllm serve` exits 0 (0.23-0.33, no fix)",
    check=check,
    apply=apply,
    fixes=('after the `VLLM::EngineCore` process dies, the API server stops but exits **0**: `restart: on-failure` / '
     'systemd `Restart=on-failure` take it for a clean stop'),
    tests=('`test_engine_death_exits_1`; `tests/test_faults.py::test_slow_start_queue_limit_then_engine_death` (exit 1 on '
     '0.32)'),
    delete_when='vLLM exits non-zero after an engine death',
    details=f"""
wraps `terminate_if_errored` (vLLM's launcher module, and the exception
handler module that imported it by name: `serve/exception_handling/handlers/vllm_error.py` on
0.30 and 0.32, `serve/utils/server_utils.py` on 0.23) to record the death when that call is the one that
stops the server and nobody asked the engine client to stop (`AsyncLLM.shutdown` is wrapped to
note a SIGTERM/SIGINT stop: the requests cut by the shutdown timeout then see a dead engine too,
and that stop must still exit 0). `run_server` (where vLLM defines it and in
`vllm.entrypoints.cli.serve`, which imported it by name) is wrapped to raise `SystemExit({EXIT_CODE})` once
vLLM's own shutdown has finished: exit {EXIT_CODE} through Python's normal teardown (atexit handlers,
multiprocessing's child cleanup, log flushing), which `os._exit({EXIT_CODE})` from an atexit handler would
skip for every handler registered before it. Logs "the engine died: the API server stops and
will exit with code {EXIT_CODE}". Predicate: the AST of vLLM's `terminate_if_errored` (read from source
without importing the launcher, which pulls in uvicorn and FastAPI) does nothing but set
`should_exit`. Only the single-API-server path (`vllm serve` without `--api-server-count` > 1,
what this project runs) is covered.
""",
    evidence={"0.30.0": ('applied', ('`entrypoints/launchers/launcher.py:199-209`: `terminate_if_errored` only sets '
                         '`server.should_exit` (also imported by name in '
                         '`entrypoints/serve/exception_handling/handlers/vllm_error.py:7`); `run_server` '
                         '(`entrypoints/launchers/api_server/entry.py:163`, imported by name in '
                         '`entrypoints/cli/serve.py:13` and `entrypoints/openai/api_server.py:10`) returns normally: '
                         'exit 0 after an engine death without the plugin'))},
)
