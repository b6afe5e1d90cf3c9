"""The target vLLM's own API server loop (`serve_http`, its signal handling, watchdog and
`terminate_if_errored`) around a stand-in engine client, run the way `vllm serve` runs it.

No engine of these CUDA wheels can start on a CPU, so the engine client is an `AsyncLLM` without
an engine core: its `errored` / `is_running` say whether the "engine" died, and its `shutdown()` is
vLLM's own. `vllm serve`'s `run_server` (`vllm.entrypoints.cli.serve.run_server`) is replaced by one
that serves a FastAPI app through vLLM's `serve_http` BEFORE vLLM loads plugins, so the plugin
wraps it where it would wrap vLLM's. uvicorn and FastAPI are in each target's lock, at the CPU
stack's versions (within both vLLMs' ranges).

Usage: python serve_harness.py PORT death|sigterm
  death    the engine dies 1 s after start (vLLM's watchdog notices within 5 s), no request
  sigterm  a request that never gets output (as one cut by --shutdown-timeout) is in flight
           when the process gets SIGTERM
Prints `RESULT {json}` (the cut request's HTTP status, seconds from SIGTERM to the end of
run_server) and exits with the process's real exit code.
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
from vllm.plugins import load_general_plugins
from vllm.v1.engine.async_llm import AsyncLLM

try:  # vLLM >= 0.30
    from vllm.entrypoints.launchers import launcher
except ImportError:  # vLLM 0.23
    from vllm.entrypoints import launcher  # type: ignore[no-redef]

port, mode = int(sys.argv[1]), sys.argv[2]
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


def request_cut_request() -> None:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/generate", timeout=60) as response:
            result["status"] = response.status
    except urllib.error.HTTPError as error:
        result["status"] = error.code
    except OSError as error:
        result["status"] = f"{type(error).__name__}"
    result["request_s"] = round(time.monotonic() - started, 1)


async def run_server(args: object) -> None:
    engine = object.__new__(StandInEngine)
    engine.vllm_config = type("Config", (), {"shutdown_timeout": 0})()
    app = FastAPI()
    app.state.engine_client = engine

    @app.get("/generate")
    async def generate() -> dict:
        await asyncio.Event().wait()  # its output never comes: the engine was stopped
        return {}

    async def scenario() -> None:
        await asyncio.sleep(1)
        if mode == "death":
            engine.dead = True
            return
        client = threading.Thread(target=request_cut_request, daemon=True)
        client.start()
        clients.append(client)
        await asyncio.sleep(1)  # the request is in flight
        result["sigterm_at"] = time.monotonic()
        print(f"SIGTERM at {time.time()}", flush=True)  # wall clock: read by the test if it hangs
        os.kill(os.getpid(), signal.SIGTERM)

    task = asyncio.get_running_loop().create_task(scenario())
    shutdown = await launcher.serve_http(app, None, host="127.0.0.1", port=port, log_level="warning")
    await shutdown
    task.cancel()
    result["config_timeout_graceful_shutdown"] = app.state.server.config.timeout_graceful_shutdown


cli_serve.run_server = run_server  # what `vllm serve` calls; vLLM loads plugins after this import
load_general_plugins()
try:
    uvloop.run(cli_serve.run_server(None))
finally:
    for client in clients:
        client.join(10)
    if "sigterm_at" in result:
        result["stopped_after_sigterm_s"] = round(time.monotonic() - result.pop("sigterm_at"), 1)
    print("RESULT " + json.dumps(result), flush=True)
