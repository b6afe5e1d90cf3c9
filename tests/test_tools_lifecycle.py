"""minicpmv_ascend.tools.lifecycle with real processes, signals and HTTP, but no vLLM: a server
stand-in (a few lines of Python) that listens late, exits early, or ignores SIGTERM.

The real servers go through the same functions in every test that starts one (conftest.Server)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from minicpmv_ascend.tools import lifecycle
from support.server import clean_env

# Listens after DELAY seconds and lists one model; `--ignore-term` also ignores SIGTERM, and starts a
# child (in its group) that ignores it too.
STAND_IN = textwrap.dedent("""
    import http.server, json, os, signal, subprocess, sys, time
    port, delay = int(sys.argv[1]), float(sys.argv[2])
    if "--ignore-term" in sys.argv:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
        subprocess.Popen([sys.executable, "-c", child])
    if "--exit" in sys.argv:
        sys.exit(3)
    time.sleep(delay)
    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"data": [{"id": "m"}]}).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
            self.wfile.write(body)
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", port), Models).serve_forever()
""")


def stand_in(tmp_path, *args: str) -> tuple[subprocess.Popen, str]:
    port = lifecycle.free_port()
    proc = lifecycle.start([sys.executable, "-c", STAND_IN, str(port), *args], tmp_path / "log", clean_env(),
                           cwd=tmp_path)
    return proc, f"http://127.0.0.1:{port}"


def test_wait_ready_measures_from_the_start_and_stop_ends_it(tmp_path) -> None:
    started = time.monotonic()
    proc, url = stand_in(tmp_path, "1.0")
    try:
        ready = lifecycle.wait_ready(proc, url, 30, "m", started=started)
        assert 1.0 <= ready < 10
        with pytest.raises(lifecycle.NotReady, match="not ready after 1 s"):
            lifecycle.wait_ready(proc, url, 1, "other-model")
    finally:
        code = lifecycle.stop(proc, timeout=10)
    assert code == -signal.SIGTERM and not lifecycle.group_alive(proc.pid)


def test_wait_ready_stops_waiting_when_the_server_exits(tmp_path) -> None:
    proc, url = stand_in(tmp_path, "0", "--exit")
    started = time.monotonic()
    with pytest.raises(lifecycle.NotReady, match="exited with 3 before ready"):
        lifecycle.wait_ready(proc, url, 60)
    assert time.monotonic() - started < 10
    lifecycle.stop(proc)


def test_stop_kills_a_server_that_ignores_sigterm_and_its_group(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(lifecycle, "GROUP_GRACE_S", 0.5)
    proc, url = stand_in(tmp_path, "0", "--ignore-term")
    lifecycle.wait_ready(proc, url, 30)
    started = time.monotonic()
    assert lifecycle.stop(proc, signal.SIGTERM, timeout=1) == -signal.SIGKILL
    assert time.monotonic() - started < 10
    assert not lifecycle.group_alive(proc.pid), "the child that ignores SIGTERM outlived the stop"


def test_own_servers_are_not_counted_as_foreign_vllm_processes(tmp_path) -> None:
    """What bench and fuzz record beside their figures: vLLM processes of other users only."""
    import psutil

    marker = f"vllm_cli foreign {tmp_path.name}"

    def orphans() -> list[int]:
        return [p.pid for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]

    own = lifecycle.start([sys.executable, "-c", "import time; time.sleep(60)  # vllm_cli"], tmp_path / "own",
                          clean_env())
    # An orphan in a session of its own (its parent exits at once): not ours, like another user's server.
    orphan = f"import time; time.sleep(60)  # {marker}"
    subprocess.run([sys.executable, "-c", "import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
                    f"{orphan!r}], start_new_session=True)"], check=True, timeout=30)
    try:
        time.sleep(0.5)
        foreign = lifecycle.foreign_vllm_pids()
        assert own.pid not in foreign
        assert len(orphans()) == 1 and set(orphans()) <= foreign
        assert lifecycle.session_rss_mib(own.pid) > 1
        load = lifecycle.machine_load()
        assert load["foreign_vllm_processes"] >= 1 and len(load["loadavg"]) == 3
    finally:
        lifecycle.stop(own, signal.SIGKILL)
        for pid in orphans():
            os.kill(pid, signal.SIGKILL)


# Busy for ARGV[1] seconds of wall time (a server under load, or other work on the machine).
SPIN = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass"


def spinning_orphan(seconds: float, *tag: str) -> int:
    """A busy process in a session of its own whose parent exits at once: not a descendant of this
    process, like a server someone else started or another user's work. Returns its pid."""
    # Not our pipes, or run() would wait for the orphan to close them.
    launcher = ("import subprocess, sys; print(subprocess.Popen(sys.argv[1:], start_new_session=True, "
                "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)")
    done = subprocess.run([sys.executable, "-c", launcher, sys.executable, "-c", SPIN, str(seconds), *tag],
                          capture_output=True, text=True, check=True, timeout=30)
    return int(done.stdout)


def test_cpu_window_tells_the_server_under_test_from_other_work(tmp_path) -> None:
    """bench's 'contended' flag: CPU time of the server under test (its process tree or session) and of
    the harness (this process, its children, also those already reaped) is not contention; a busy
    process outside both is. The load average, which the flag used to read, counts all three."""
    import resource

    import psutil

    server = spinning_orphan(8, "vllm_cli")  # looks like vLLM: the old flag also counted it as a foreign server
    other = spinning_orphan(8)
    try:
        time.sleep(0.3)
        cpu = {pid: psutil.Process(pid).cpu_times() for pid in (server, other)}
        reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
        before = lifecycle.cpu_snapshot()
        # The benchmark client stand-in: a child of this process, busy for 1 s, waited for in the window.
        subprocess.run([sys.executable, "-c", SPIN, "1.0"], check=True, timeout=60)
        after = lifecycle.cpu_snapshot()
        reaped_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        spent = {pid: sum(psutil.Process(pid).cpu_times()[:2]) - sum(cpu[pid][:2]) for pid in (server, other)}
        client = reaped_after.ru_utime + reaped_after.ru_stime - reaped.ru_utime - reaped.ru_stime

        window = lifecycle.cpu_window(before, after, [server])
        blind = lifecycle.cpu_window(before, after)  # no server named: what a load figure sees
        seconds = window["seconds"]
        assert window["server_processes"] == 1 and seconds >= 1.0
        assert spent[server] > 0.1 and spent[other] > 0.1, spent  # both really ran
        assert abs(window["server_cores"] - spent[server] / seconds) < 0.1, (window, spent)
        assert window["harness_cores"] * seconds > client - 0.05, (window, client)
        assert window["other_cores"] > spent[other] / seconds - 0.1, (window, spent)
        # The server's time moved out of "other", and nothing else changed.
        assert blind["server_cores"] == 0 and blind["harness_cores"] == window["harness_cores"]
        assert abs(blind["other_cores"] - window["other_cores"] - window["server_cores"]) < 0.02, (blind, window)

        assert server in lifecycle.foreign_vllm_pids()
        assert server not in lifecycle.foreign_vllm_pids([server])
        assert lifecycle.machine_load([server])["foreign_vllm_processes"] < lifecycle.machine_load()["foreign_vllm_processes"]
    finally:
        for pid in (server, other):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_server_pids_on_port_finds_the_server_under_test(tmp_path) -> None:
    """The listener itself; under a vLLM parent (vLLM's main process above its API servers with
    --api-server-count 2) that parent, whose tree holds the engine too."""
    proc, url = stand_in(tmp_path, "0")
    try:
        lifecycle.wait_ready(proc, url, 30)
        assert lifecycle.server_pids_on_port(int(url.rsplit(":", 1)[1])) == [proc.pid]
        assert lifecycle.server_pids_on_port(lifecycle.free_port()) == []
    finally:
        lifecycle.stop(proc, timeout=10)
    port = lifecycle.free_port()
    # Like vLLM's main process, the parent stops its API server on SIGTERM (else stop() waits out
    # GROUP_GRACE_S for the orphan before it kills the group).
    parent = ("import signal, subprocess, sys\n"
              "child = subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2], '0'])\n"
              "signal.signal(signal.SIGTERM, lambda *_: child.terminate())\n"
              "child.wait()")
    main = lifecycle.start([sys.executable, "-c", parent, STAND_IN, str(port), "VLLM::main"], tmp_path / "main",
                           clean_env(), cwd=tmp_path)
    try:
        lifecycle.wait_ready(main, f"http://127.0.0.1:{port}", 30)
        assert lifecycle.server_pids_on_port(port) == [main.pid]
    finally:
        assert lifecycle.stop(main, timeout=10) == 0
