"""The entrypoint as an orchestrator sees it: the embedded default, exec (no wrapper process),
and SIGTERM (bad settings: test_bad_config.py). Each test owns its server; they stop or break it."""

from __future__ import annotations

import pathlib
import re
import signal
import time

import pytest

from minicpmv_ascend.settings.plan import SMALL_CPU_HOST_MAX_CPUS, usable_cpus
from support.server import start_server


def cmdline(pid: int) -> list[str]:
    return pathlib.Path(f"/proc/{pid}/cmdline").read_text().split("\0")


@pytest.mark.engine(engines=1)
def test_default_model_is_served_with_a_random_weights_warning_and_sigterm_exits_0(tmp_path):
    """No MODEL_PATH: the launcher generates the embedded tiny checkpoint into the cache directory,
    says loudly that its weights are random, then execs vLLM in its own process."""
    cache = tmp_path / "cache"
    srv = start_server(None, tmp_path / "server.log", MINICPMV_CACHE_DIR=str(cache))
    try:
        ready_s = srv.wait_ready()
        print(f"default-model server ready in {ready_s:.1f} s")
        log = srv.log_path.read_text()
        assert "RANDOM" in log and "MODEL_PATH" in log, "the random-weights warning is missing"
        assert any(cache.rglob("config.json")), "the embedded checkpoint was not generated in the cache dir"
        # The CPU binding default reached vLLM: on a small host no core is kept from the model.
        small_host = usable_cpus() <= SMALL_CPU_HOST_MAX_CPUS
        assert ("reserved_cpus=[]" in log) == small_host, re.findall(r"core ids=.*|reserved_cpus=.*", log)
        # exec: the PID the orchestrator started is now vLLM's API server, not a wrapper around it.
        args = cmdline(srv.process.pid)
        assert "minicpmv_ascend.vllm_cli" in args and "serve" in args, args
        started = time.monotonic()
        assert srv.stop(signal.SIGTERM, timeout=60) == 0, srv.log_tail()
        print(f"SIGTERM to exit: {time.monotonic() - started:.1f} s")
    finally:
        srv.stop(signal.SIGKILL)
