"""Servers this kit starts itself, from start to stop: the tests' servers, bench's A/B servers,
fuzz's own server (and the schemathesis runs it bounds). One way to do each step:

    free_port()                        a TCP port nothing listens on now
    entrypoint_command(*args)          the container's command from this checkout (entrypoint.py)
    start(cmd, log_path, env, cwd)     in its own session and process group, output to a log file
    wait_ready(proc, base_url, ...)    until /v1/models lists the model, bounded; NotReady says why
    stop(proc, sig, timeout)           a signal to it as an orchestrator sends one, then the group

And what the machine was doing meanwhile (bench and fuzz record it beside their figures, because on
a shared machine other servers change them): the load average and the vLLM processes this process
did not start, counted with psutil (in every vLLM environment: requirements/cpu.lock,
vllm023.lock; imported where processes are counted, because schemathesis imports the fuzzer's
hooks, and so this module, in .venv-fuzz, which has no psutil).
"""

from __future__ import annotations

import datetime
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from minicpmv_ascend.common.http import Client, RequestFailed

REPO = pathlib.Path(__file__).resolve().parents[3]  # the checkout (entrypoint.py, healthcheck/, src/)
READY_POLL_S = 0.25  # bench reports the time to ready: the poll interval is its resolution
GROUP_GRACE_S = 10.0  # after the server exits, for the rest of its group (vLLM's engine core) to follow
# vLLM's processes as `ps` shows them: the engine core, the CLI, this kit's entrypoint and launcher.
VLLM_PROCESS = re.compile(r"EngineCore|vllm_cli|entrypoint\.py|minicpmv_ascend\.launcher|VLLM::")

# Sessions of the servers start() started and stop() has not yet stopped: not "foreign".
_own_sessions: set[int] = set()


class NotReady(Exception):
    """The server exited, or the time ran out, before it was ready; the message says which."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def entrypoint_command(*args: str) -> list[str]:
    """What the container runs: entrypoint.py of this checkout; where the package is installed
    without one (the Ascend image keeps the shim at /opt/minicpmv-ascend), the launcher module."""
    script = REPO / "entrypoint.py"
    launcher = [str(script)] if script.is_file() else ["-m", "minicpmv_ascend.launcher"]
    return [sys.executable, *launcher, *args]


def start(cmd: Sequence[str], log_path: pathlib.Path, env: Mapping[str, str], cwd: pathlib.Path = REPO,
          ) -> subprocess.Popen:
    """Start `cmd` with stdout and stderr into `log_path`, as the leader of a new session (and
    process group): a terminal's signals do not reach it, and stop() can end all it started."""
    with log_path.open("w") as log:
        proc = subprocess.Popen(list(cmd), env=dict(env), cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    _own_sessions.add(proc.pid)
    return proc


def wait_ready(proc: subprocess.Popen, base_url: str, timeout: float, model: str | None = None,
               api_key: str | None = None, started: float | None = None) -> float:
    """Seconds from `started` (a time.monotonic(); default: now) until GET /v1/models lists `model`
    (None: any model), polling every READY_POLL_S; NotReady when `proc` exits first or `timeout`
    seconds (from `started`) pass."""
    started = time.monotonic() if started is None else started
    client = Client(base_url, 2, api_key)
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            raise NotReady(f"exited with {proc.returncode} before ready")
        try:
            served = {m["id"] for m in client.get_json("/v1/models")["data"]}
            if served and (model is None or model in served):
                return time.monotonic() - started
        except (RequestFailed, KeyError, TypeError):
            pass  # not listening yet, or not answering the list yet
        time.sleep(READY_POLL_S)
    raise NotReady(f"not ready after {timeout:g} s")


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int | None:
    """Stop a process start() started; return its exit code.

    `sig` goes to the process itself, as an orchestrator signals a container's PID 1 (vLLM's API
    server then stops its engine); after `timeout` seconds, SIGKILL to its whole group. Whatever
    is left of the group once it has exited gets GROUP_GRACE_S (none after SIGKILL), then SIGKILL.
    """
    if proc.poll() is None:
        _signal(proc, sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.wait(10)
    deadline = time.monotonic() + (0 if sig == signal.SIGKILL else GROUP_GRACE_S)
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if group_alive(proc.pid):
        _kill_group(proc.pid)
        deadline = time.monotonic() + 10
        while group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
    _own_sessions.discard(proc.pid)
    return proc.returncode


def _signal(proc: subprocess.Popen, sig: int) -> None:
    if sig == signal.SIGKILL:
        _kill_group(proc.pid)
        return
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        pass


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


# --------------------------------------------------------------------------------------------
# What the machine was doing
# --------------------------------------------------------------------------------------------


def session_rss_mib(sid: int) -> float:
    """Resident memory of every process in session `sid` (a started server: its API server, engine
    core and workers), in MiB."""
    import psutil

    total = 0
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == sid:
                total += process.memory_info().rss
        except (psutil.Error, OSError):
            continue  # gone meanwhile, or not ours to read
    return round(total / 2**20, 1)


def foreign_vllm_pids() -> set[int]:
    """vLLM processes on this machine that this process did not start (other users' servers):
    neither this process's descendants nor members of a session start() started."""
    import psutil

    me = psutil.Process()
    own = {me.pid, *(child.pid for child in me.children(recursive=True))}
    found = set()
    for process in psutil.process_iter(["name", "cmdline"]):
        try:
            if process.pid in own or os.getsid(process.pid) in _own_sessions:
                continue
        except OSError:
            continue  # gone meanwhile
        cmdline = " ".join(process.info["cmdline"] or [])
        if VLLM_PROCESS.search(cmdline) or VLLM_PROCESS.search(process.info["name"] or ""):
            found.add(process.pid)
    return found


def machine_load() -> dict[str, Any]:
    return {"loadavg": [round(v, 2) for v in os.getloadavg()], "foreign_vllm_processes": len(foreign_vllm_pids()),
            "time": now()}


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
