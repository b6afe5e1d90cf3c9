"""Servers this kit starts itself, from start to stop: the tests' servers, bench's A/B servers,
fuzz's own server (and the schemathesis runs it bounds). One way to do each step:

    free_port()                        a TCP port nothing listens on now
    entrypoint_command(*args)          the container's command from this checkout (entrypoint.py)
    start(cmd, log_path, env, cwd)     in its own session and process group, output to a log file
    wait_ready(proc, base_url, ...)    until /v1/models lists the model, bounded; NotReady says why
    stop(proc, sig, timeout)           a signal to it as an orchestrator sends one, then the group

And what the machine was doing meanwhile (bench and fuzz record it beside their figures, because on
a shared machine other servers change them): the load average, the vLLM processes this process
did not start, and, over a measurement window, the CPU time spent outside the server under test
and this harness (cpu_snapshot / cpu_window: the load average cannot tell the server under test
from other work, so it marks every benchmark cell busy). Counted with psutil (in every vLLM
environment: requirements/cpu.lock, vllm023.lock; imported where processes are counted, because
schemathesis imports the fuzzer's hooks, and so this module, in .venv-fuzz, which has no psutil).
"""

from __future__ import annotations

import dataclasses
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


def foreign_vllm_pids(server_pids: Sequence[int] = ()) -> set[int]:
    """vLLM processes on this machine that are neither under test nor started here (other users'
    servers): not this process's descendants, not members of a session start() started, and not in
    the process tree or session of `server_pids` (a server under test that someone else started)."""
    import psutil

    me = psutil.Process()
    own = {me.pid, *(child.pid for child in me.children(recursive=True))}
    if server_pids:
        own |= _tree(cpu_snapshot(), server_pids)
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


def machine_load(server_pids: Sequence[int] = ()) -> dict[str, Any]:
    return {"loadavg": [round(v, 2) for v in os.getloadavg()],
            "foreign_vllm_processes": len(foreign_vllm_pids(server_pids)), "time": now()}


# A process of a vLLM server: vLLM's own process titles and command lines, and this kit's.
SERVER_PROCESS = re.compile(r"vllm|VLLM::|entrypoint\.py|minicpmv_ascend")


def _is_server_process(process: Any) -> bool:
    """By its process title (vLLM's `VLLM::...`) or arguments, not its interpreter's path (a
    `.venv-vllm030/bin/python` running pytest is no server)."""
    cmdline = process.cmdline()
    title = cmdline[0] if cmdline and cmdline[0].startswith("VLLM::") else ""
    return bool(SERVER_PROCESS.search(" ".join([title, *cmdline[1:], process.name()])))


def server_pids_on_port(port: int) -> list[int]:
    """The server under test when its URL points here: the process listening on TCP `port` (one
    this user may see; psutil shows no pid for another user's socket), raised to the topmost vLLM
    process above it. With `--api-server-count` > 1 the listener is one of several API servers,
    children of vLLM's main process, which also parents the engine core."""
    import psutil

    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}  # never climb into the harness's own line
    roots = set()
    for pid in {c.pid for c in psutil.net_connections("tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid}:
        try:
            process = psutil.Process(pid)
        except psutil.Error:
            continue  # gone meanwhile
        try:
            while (parent := process.parent()) and parent.pid not in mine and _is_server_process(parent):
                process = parent
        except psutil.Error:
            pass  # a parent gone meanwhile, or not ours to read: the highest found so far
        roots.add(process.pid)
    return sorted(roots)


@dataclasses.dataclass(frozen=True)
class CpuSnapshot:
    """The machine's busy CPU seconds, and each process's (parent, session, CPU seconds) at one moment.

    A process's CPU seconds include its reaped children's (psutil's children_user/children_system),
    so the sum over a process tree keeps the time of members that exited and were waited for.
    """

    time: float  # time.monotonic()
    busy_s: float  # every CPU's non-idle time since boot (user, nice, system, irq, softirq, steal)
    processes: Mapping[int, tuple[int, int, float]]  # pid -> (ppid, sid, CPU seconds)


def cpu_snapshot() -> CpuSnapshot:
    import psutil

    times = psutil.cpu_times()
    busy = times.user + times.nice + times.system + times.irq + times.softirq + times.steal
    processes = {}
    for process in psutil.process_iter(["ppid", "cpu_times"]):
        cpu = process.info["cpu_times"]
        try:
            sid = os.getsid(process.pid)
        except OSError:
            continue  # gone meanwhile
        if cpu is not None:  # None: not readable (another user's, on a hardened /proc)
            processes[process.pid] = (process.info["ppid"], sid,
                                      cpu.user + cpu.system + cpu.children_user + cpu.children_system)
    return CpuSnapshot(time.monotonic(), busy, processes)


def _tree(snapshot: CpuSnapshot, roots: Sequence[int]) -> set[int]:
    """`roots` and their descendants; where a root leads a session (start() starts servers so),
    every member of that session too (a worker its parent left behind still belongs to it)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in snapshot.processes.items():
        children.setdefault(ppid, []).append(pid)
    leaders = {root for root in roots if snapshot.processes.get(root, (0, 0, 0))[1] == root}
    members = {pid for pid, (_, sid, _) in snapshot.processes.items() if sid in leaders}
    todo = [pid for pid in (*roots, *members) if pid in snapshot.processes]
    found: set[int] = set()
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def _tree_cpu_s(snapshot: CpuSnapshot, pids: set[int]) -> float:
    return sum(snapshot.processes[pid][2] for pid in pids)


def cpu_window(before: CpuSnapshot, after: CpuSnapshot, server_pids: Sequence[int] = ()) -> dict[str, Any]:
    """Where the machine's CPU time went between two snapshots, in cores (CPU seconds per second):
    the server under test (the trees or sessions of `server_pids`), this harness (this process and
    its descendants outside the server: the benchmark client), and everything else (`other_cores`:
    what really competes with the measurement). The load average cannot make this split."""
    seconds = after.time - before.time
    if seconds <= 0:
        raise ValueError("cpu_window: `after` was taken before `before`")

    def cores(pids_before: set[int], pids_after: set[int]) -> float:
        return max(0.0, _tree_cpu_s(after, pids_after) - _tree_cpu_s(before, pids_before)) / seconds

    server_before, server_after = _tree(before, server_pids), _tree(after, server_pids)
    me = [os.getpid()]
    server = cores(server_before, server_after)
    harness = cores(_tree(before, me) - server_before, _tree(after, me) - server_after)
    busy = max(0.0, after.busy_s - before.busy_s) / seconds
    return {"seconds": round(seconds, 2), "busy_cores": round(busy, 3), "server_cores": round(server, 3),
            "harness_cores": round(harness, 3), "other_cores": round(max(0.0, busy - server - harness), 3),
            "server_processes": len(server_after)}


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
