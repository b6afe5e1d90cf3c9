"""The target vLLM's own API server loop (`serve_http`, its signal handling, watchdog and
`terminate_if_errored`) around a stand-in engine client, run the way `vllm serve` runs it.

No engine of these CUDA wheels can start on a CPU, so the engine client is an `AsyncLLM` without
an engine core: its `errored` / `is_running` say whether the "engine" died, and its `shutdown()` is
vLLM's own. `vllm serve`'s `run_server` (`vllm.entrypoints.cli.serve.run_server`) is replaced by one
that serves a FastAPI app through vLLM's `serve_http` BEFORE vLLM loads plugins, so the plugin
wraps it where it would wrap vLLM's. uvicorn and FastAPI are in each target's lock, at the CPU
stack's versions (within both vLLMs' ranges).

Usage: python serve_harness.py PORT death|sigterm|drain
  death    the engine dies 1 s after start (vLLM's watchdog notices within 5 s), no request
  sigterm  a request that never gets output (as one cut by --shutdown-timeout) is in flight
           when the process gets SIGTERM
  drain    --shutdown-timeout DRAIN_S: the engine client's engine core takes DRAIN_S s to stop
           (vLLM's drain), then the engine is dead. In flight at SIGTERM: a request that
           finishes DRAIN_S - 2 s into the drain, one that never gets output (uvicorn cuts it)
           and one that fails with EngineDeadError when the engine stops (the target's own
           exception handler answers it), and a stream that began before SIGTERM and ends with
           the EngineDeadError event when the engine stops (as vLLM's serving code ends a stream
           on an error); 0.5 s into the drain, /health (the target's route) and
           a new request.
Prints `RESULT {json}` (each request's HTTP status, body and content type; seconds from SIGTERM
to the end of run_server; the last line counts, one is printed after each request in case the
process never ends) and exits with the process's real exit code.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request

import uvloop
import vllm.entrypoints.cli.serve as cli_serve
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from vllm.plugins import load_general_plugins
from vllm.v1.engine.async_llm import AsyncLLM

try:  # vLLM >= 0.30
    from vllm.entrypoints.launchers import launcher
    from vllm.entrypoints.serve.exception_handling.handlers.vllm_error import engine_error_handler
except ImportError:  # vLLM 0.23
    from vllm.entrypoints import launcher  # type: ignore[no-redef]
    from vllm.entrypoints.serve.utils.server_utils import engine_error_handler  # type: ignore[no-redef]
from vllm.entrypoints.serve.instrumentator.health import router as health_router
from vllm.v1.engine.exceptions import EngineDeadError

port, mode = int(sys.argv[1]), sys.argv[2]
DRAIN_S = 6  # longer than shutdown_cut_requests.GRACE_S (3): the drain must not be cut at 3 s
result: dict = {}
clients: list[threading.Thread] = []


class StandInEngine(AsyncLLM):
    """vLLM's AsyncLLM (its shutdown()), without an engine core behind it."""

    dead = False

    @property
    def is_running(self) -> bool:
        return not self.dead

    @property
    def errored(self) -> bool:
        return self.dead


class StandInCore:
    """An engine core whose shutdown(timeout) drains for `timeout` s; then the engine is dead."""

    def __init__(self, engine: StandInEngine, stopped: asyncio.Event) -> None:
        self.engine, self.stopped, self.loop = engine, stopped, asyncio.get_running_loop()

    def shutdown(self, timeout: float | None = None) -> None:
        if self.engine.dead:  # AsyncLLM.__del__ calls shutdown() again at exit
            return
        time.sleep(timeout or 0)
        self.engine.dead = True
        self.loop.call_soon_threadsafe(self.stopped.set)


def request(path: str = "/generate", key: str = "status", timeout: float = 60) -> None:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as response:
            result[key] = response.status
            result[f"{key}_body"] = response.read().decode(errors="replace")[-300:]
            result[f"{key}_type"] = response.headers.get("content-type")
    except urllib.error.HTTPError as error:
        result[key] = error.code
        result[f"{key}_body"] = error.read().decode(errors="replace")[:300]
        result[f"{key}_type"] = error.headers.get("content-type")
    except OSError as error:
        result[key] = f"{type(error).__name__}"
        result[f"{key}_error"] = str(error)
    result[f"{key}_s"] = round(time.monotonic() - started, 1)
    print("RESULT " + json.dumps({k: v for k, v in result.items() if k != "sigterm_at"}), flush=True)  # so far


def in_background(*args: object) -> None:
    client = threading.Thread(target=request, args=args, daemon=True)
    client.start()
    clients.append(client)


async def run_server(args: object) -> None:
    engine = object.__new__(StandInEngine)
    engine.vllm_config = type("Config", (), {"shutdown_timeout": DRAIN_S if mode == "drain" else 0})()
    stopped = asyncio.Event()
    if mode == "drain":
        engine.engine_core = StandInCore(engine, stopped)
    app = FastAPI()
    app.state.engine_client = engine
    app.state.args = type("Args", (), {"log_error_stack": False})()
    app.include_router(health_router)  # the target's /health
    app.exception_handler(EngineDeadError)(engine_error_handler)  # the target's

    @app.get("/generate")
    async def generate() -> dict:
        await asyncio.Event().wait()  # its output never comes: the engine was stopped
        return {}

    @app.get("/generate-engine-dies")
    async def generate_engine_dies() -> dict:
        await stopped.wait()  # vLLM's output handler sees the engine stop before it is cancelled
        raise EngineDeadError()

    @app.get("/generate-stream-engine-dies")
    async def generate_stream_engine_dies() -> StreamingResponse:
        async def events():  # the stream's 200 went out before the engine stopped
            yield 'data: {"choices": []}\n\n'
            await stopped.wait()
            error = {"message": str(EngineDeadError()), "type": "InternalServerError", "param": None, "code": 500}
            yield f"data: {json.dumps({'error': error})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/slow")
    async def slow() -> dict:
        await asyncio.sleep(DRAIN_S - 1)  # started 1 s before SIGTERM: done DRAIN_S - 2 s into the drain
        return {"ok": True}

    @app.get("/quick")
    async def quick() -> dict:
        return {"ok": True}

    async def scenario() -> None:
        await asyncio.sleep(1)
        if mode == "death":
            engine.dead = True
            return
        if mode == "drain":  # clients that give up sooner: without the plugin the cut one hangs
            in_background("/generate", "status", DRAIN_S + 10)
            in_background("/generate-engine-dies", "engine_dies", DRAIN_S + 10)
            in_background("/generate-stream-engine-dies", "stream_engine_dies", DRAIN_S + 10)
            in_background("/slow", "slow", DRAIN_S + 10)
        else:
            in_background()
        await asyncio.sleep(1)  # the requests are in flight
        result["sigterm_at"] = time.monotonic()
        print(f"SIGTERM at {time.time()}", flush=True)  # wall clock: read by the test if it hangs
        os.kill(os.getpid(), signal.SIGTERM)
        if mode == "drain":
            await asyncio.sleep(0.5)  # the drain has begun
            await asyncio.to_thread(request, "/health", "health", 5)
            await asyncio.to_thread(request, "/quick", "new_request", 5)

    task = asyncio.get_running_loop().create_task(scenario())
    shutdown = await launcher.serve_http(app, None, host="127.0.0.1", port=port, log_level="warning")
    await shutdown
    task.cancel()
    result["config_timeout_graceful_shutdown"] = app.state.server.config.timeout_graceful_shutdown


cli_serve.run_server = run_server  # what `vllm serve` calls; vLLM loads plugins after this import
load_general_plugins()
if os.environ.get("MINICPMV_HARNESS_UVICORN_SIGNALS") == "on":  # the plugin minus uvicorn-signals
    import uvicorn.server

    capture = uvicorn.server.Server.capture_signals
    uvicorn.server.Server.capture_signals = getattr(capture, "_minicpmv_ascend_plugin_wraps", capture)
try:
    uvloop.run(cli_serve.run_server(None))
finally:
    for client in clients:
        client.join(10)
    if "sigterm_at" in result:
        result["stopped_after_sigterm_s"] = round(time.monotonic() - result.pop("sigterm_at"), 1)
    print("RESULT " + json.dumps(result), flush=True)
