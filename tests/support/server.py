"""The real vLLM servers of the tests: started the way the container starts them (`python
entrypoint.py` with settings from the environment), every wait bounded; a server that dies or hangs
fails the tests that need it with the tail of its log. The session's shared servers are fixtures of
tests/conftest.py; their settings are here, beside the helpers that start them.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import signal
import subprocess

import pytest

from minicpmv_ascend.tools import lifecycle
from minicpmv_ascend.tools.lifecycle import free_port  # the tests import it from here too
from support import REPO
from support.raw_http import send

SERVED_MODEL_NAME = "minicpm-v-4.6-thinking"
# Measured 25-60 s on a 2-core machine; 234 s once (2026-12-02, a slow instance of the CI kind: the
# other shared server, started beside the first one while its tests ran). A bound, not a budget.
SERVER_READY_TIMEOUT_S = 600
SERVER_STOP_TIMEOUT_S = 60


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    return send(url, timeout=timeout)


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


def serve_shared(srv: Server, label: str, **wait: str):
    """The body of a shared server's session fixture (tests/conftest.py): allowed by the test
    tiers, waited for, yielded, stopped."""
    import tiers

    tiers.allow_shared_server(srv.process.pid)
    try:
        ready_s = srv.wait_ready(**wait)
        print(f"\n{label} ready in {ready_s:.1f} s on port {srv.port}")
        yield srv
    finally:
        srv.stop()


# What the shared server sets beyond the defaults: image URLs from public addresses (the
# recommended way to turn them on; media URL fetching is off by default), plus one loopback host,
# listed explicitly, which the image-URL examples and tests fetch from.
SHARED_SERVER_ENV = {"ALLOWED_MEDIA_DOMAINS": "public,127.0.0.1"}


# The second shared server, for what the first must not have (the first runs the CPU image's
# defaults, which tests/test_deploy_cpu.py compares it with): an API key from a file (as a mounted
# secret), one allowed local media directory, per-request processor options trusted
# (--trust-request-mm-kwargs), prefix caching on and 64-token prefill chunks (every prompt longer
# than that is prefilled in chunks). Its media URL settings are the defaults (fetching off). The
# security proofs (tests/test_security.py), the request sweep's chunk boundaries, prefix cache and
# processor options (test_request_sweep.py) and the whole parity prompt set (test_parity.py) only
# send it requests; they need these settings together, none needs one of them absent.
OTHER_SERVER_KEY = "sk-security-7c1e-never-in-argv-or-logs"
OTHER_SERVER_CHUNK = 64  # its MAX_NUM_BATCHED_TOKENS
