"""Shared fixtures: one tiny random checkpoint and one real vLLM CPU server per test session.

The server is started the way the container starts it: `python entrypoint.py` with settings from
the environment. Every wait is bounded; a server that dies or hangs fails the tests that need it
with the tail of its log.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import signal
import subprocess
import urllib.error
import urllib.request

import pytest

from minicpmv_ascend.tools import lifecycle
from minicpmv_ascend.tools.lifecycle import free_port

REPO = pathlib.Path(__file__).resolve().parents[1]
SERVED_MODEL_NAME = "minicpm-v-4.6-thinking"
SERVER_READY_TIMEOUT_S = 240  # measured 25-60 s on a 2-core machine; generous for a loaded CI box
SERVER_STOP_TIMEOUT_S = 60


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def clean_env(**overrides: str) -> dict[str, str]:
    """The parent environment minus any of the project's settings, plus `overrides`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "MINICPMV_"))}
    for name in ("MODEL_PATH", "CONFIG_FILE", "PORT", "HOST", "SERVED_MODEL_NAME", "API_KEY_FILE"):
        env.pop(name, None)
    env.update(overrides)
    return env


@dataclasses.dataclass
class Server:
    """A running vLLM server started through entrypoint.py."""

    process: subprocess.Popen
    port: int
    model: str
    log_path: pathlib.Path
    env: dict[str, str]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_ready(self, timeout: float = SERVER_READY_TIMEOUT_S, api_key: str | None = None) -> float:
        """Seconds until /v1/models lists the served model; fails with the log if it never does."""
        try:
            return lifecycle.wait_ready(self.process, self.base_url, timeout, self.model, api_key)
        except lifecycle.NotReady as err:
            pytest.fail(f"server {err}:\n{self.log_tail()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = SERVER_STOP_TIMEOUT_S) -> int:
        """`sig` to the server (SIGKILL to its process group after `timeout`), then the rest of its
        group; its exit code."""
        return lifecycle.stop(self.process, sig, timeout)


def start_server(checkpoint: pathlib.Path | None, log_path: pathlib.Path, *args: str, **env: str) -> Server:
    """Start entrypoint.py on a free port; `checkpoint=None` leaves MODEL_PATH unset (the default)."""
    port = free_port()
    if checkpoint is not None:
        env["MODEL_PATH"] = str(checkpoint)
    server_env = clean_env(PORT=str(port), **env)
    # A session of its own: signals from the terminal do not reach it; tests send their own.
    process = lifecycle.start(lifecycle.entrypoint_command(*args), log_path, server_env, cwd=REPO)
    model = server_env.get("SERVED_MODEL_NAME", SERVED_MODEL_NAME)
    return Server(process, port, model, log_path, {"PORT": str(port), "SERVED_MODEL_NAME": model})


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> pathlib.Path:
    from minicpmv_ascend.checkpoint import generate

    return generate(tmp_path_factory.mktemp("ckpt") / "minicpmv46-tiny", "tiny", seed=0)


# What the shared server sets beyond the defaults: image URLs from public addresses (the
# recommended way to turn them on; media URL fetching is off by default), plus one loopback host,
# listed explicitly, which the image-URL examples and tests fetch from.
SHARED_SERVER_ENV = {"ALLOWED_MEDIA_DOMAINS": "public,127.0.0.1"}


@pytest.fixture(scope="session")
def server(tiny_checkpoint, tmp_path_factory):
    """The shared server for tests that only send requests (they must not stop or break it)."""
    srv = start_server(tiny_checkpoint, tmp_path_factory.mktemp("server") / "server.log", **SHARED_SERVER_ENV)
    try:
        ready_s = srv.wait_ready()
        print(f"\nshared vLLM server ready in {ready_s:.1f} s on port {srv.port}")
        yield srv
    finally:
        srv.stop()
