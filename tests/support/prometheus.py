"""A real Prometheus on 127.0.0.1 for the observability tests: Debian's package (bookworm's 2.42.0,
with promtool; `make system-packages` installs it), started with the compose users' scrape config
of deploy/observability/prometheus.yaml (its job and rule file, only the target and the intervals
changed) against a real vLLM server, queried through its HTTP API. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest
import yaml

from minicpmv_ascend.tools import observability
from minicpmv_ascend.tools.lifecycle import free_port

START_TIMEOUT_S = 30  # Prometheus 2.42 is ready in about a second on an empty database
STOP_TIMEOUT_S = 30


def binary(name: str) -> str:
    """prometheus or promtool, from Debian's package; a clear failure where it is missing."""
    path = shutil.which(name) or next((p for p in (f"/usr/bin/{name}",) if pathlib.Path(p).exists()), None)
    if path is None:
        pytest.fail(f"{name} is needed by the observability tests: `make system-packages` (Debian's prometheus package)")
    return path


def promtool(*args: str, cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([binary("promtool"), *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def scrape_config(target: str, interval: str = "1s") -> dict:
    """deploy/observability/prometheus.yaml with `target` as its one target, every interval `interval`
    and the rule file by its absolute path: the job name and the rules are the shipped ones."""
    config = yaml.safe_load(observability.SCRAPE_CONFIG.read_text())
    config["global"].update(scrape_interval=interval, evaluation_interval=interval, scrape_timeout=interval)
    config["rule_files"] = [str(observability.SCRAPE_CONFIG.parent / name) for name in config["rule_files"]]
    (job,) = config["scrape_configs"]
    job["static_configs"] = [{"targets": [target]}]
    return config


class Prometheus:
    def __init__(self, process: subprocess.Popen, port: int, log_path: pathlib.Path) -> None:
        self.process, self.port, self.log_path = process, port, log_path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, path: str, **params: str) -> dict:
        url = f"{self.base_url}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as error:  # a bad query: 400 with Prometheus' reason
            answer = json.load(error)
        if answer.get("status") != "success":
            raise AssertionError(f"Prometheus refused {path} {params}: {answer.get('errorType')}: {answer.get('error')}")
        return answer["data"]

    def query(self, expr: str) -> list[dict]:
        """The instant vector `expr` evaluates to now: [{"metric": {...}, "value": [t, "v"]}, ...]."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        return data["result"]

    def wait_for(self, expr: str, timeout: float, what: str, interval: float = 0.5) -> tuple[list[dict], float]:
        """The first non-empty result of `expr`, and the seconds it took; fails after `timeout`."""
        start = time.monotonic()
        while True:
            result = self.query(expr)
            if result:
                return result, time.monotonic() - start
            if time.monotonic() - start > timeout:
                pytest.fail(f"{what}: `{expr}` still empty after {timeout} s; Prometheus' log:\n{self.log_tail()}")
            time.sleep(interval)

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def running(workdir: pathlib.Path, target: str, interval: str = "1s") -> Iterator[Prometheus]:
    """Prometheus scraping `target` (host:port) with the shipped job and rules, on a free loopback
    port, its database under `workdir`; stopped (SIGTERM, then SIGKILL) afterwards."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config(target, interval)))
    checked = promtool("check", "config", str(config))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    port = free_port()
    log_path = workdir / "prometheus.log"
    with log_path.open("w") as log:
        process = subprocess.Popen([binary("prometheus"), f"--config.file={config}",
                                    f"--storage.tsdb.path={workdir / 'data'}",
                                    f"--web.listen-address=127.0.0.1:{port}"],
                                   stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    prometheus = Prometheus(process, port, log_path)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert process.poll() is None, f"Prometheus exited {process.returncode}:\n{prometheus.log_tail()}"
            try:
                with urllib.request.urlopen(f"{prometheus.base_url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"Prometheus not ready in {START_TIMEOUT_S} s:\n{prometheus.log_tail()}")
            time.sleep(0.2)
        yield prometheus
    finally:
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
