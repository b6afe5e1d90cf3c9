"""serve_harness.py's scenarios (the target's server loop around a stand-in engine), started:
each forked from the zygote (_target.Forked) in a session of its own, its output read as it comes.
test_server_patches.py reads how they end; conftest.py starts the ones that mostly wait with the
session (`waiting_harnesses`)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import threading
import time
from collections.abc import Iterator

from _target import Forked

HARNESS = pathlib.Path(__file__).with_name("serve_harness.py")
PLUGIN_OFF = {"MINICPMV_ASCEND_PLUGIN": "off"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def harnesses(mode: str, *envs: dict[str, str] | None) -> Iterator[tuple[Forked, ...]]:
    """serve_harness.py with the plugin and with MINICPMV_ASCEND_PLUGIN=off (or with each of
    `envs`), started together (most of each run is vLLM's import, or waiting for a hang); all are
    killed on the way out."""
    processes = tuple(start(mode, env) for env in (envs or (None, PLUGIN_OFF)))
    try:
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def start(mode: str, env: dict[str, str] | None = None) -> Forked:
    """`python serve_harness.py PORT MODE` in a session of its own (forked from the zygote)."""
    process = Forked([str(HARNESS), str(free_port()), mode], env, merge_output=True, new_session=True)
    process.started = time.monotonic()  # type: ignore[attr-defined]
    # Read as it comes: a hang is timed from the SIGTERM line it prints.
    process.lines = []  # type: ignore[attr-defined]
    process.reader = threading.Thread(target=lambda: process.lines.extend(process.follow()),
                                      daemon=True)  # type: ignore[attr-defined]
    process.reader.start()
    return process
