"""Python 3.12 (the Ascend image's) runs the launcher, settings and probes.

`make test` builds .venv-py312 with only this package's own dependencies (no torch, no vLLM), as
close as this machine gets to the Ascend image's interpreter without its vLLM.
"""

from __future__ import annotations

import subprocess

import pytest

from support.server import REPO, clean_env

PY312 = REPO / ".venv-py312" / "bin" / "python"

pytestmark = [pytest.mark.py312,
              pytest.mark.skipif(not PY312.exists(), reason="run `make py312` (make test does)")]


def run312(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(PY312), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=env or clean_env())


def test_interpreter_is_3_12():
    assert run312("-c", "import sys; print(sys.version_info[:2])").stdout.strip() == "(3, 12)"


def test_every_module_compiles_on_3_12():
    targets = [p for p in ("src", "plugin", "healthcheck", "scripts", "entrypoint.py") if (REPO / p).exists()]
    result = run312("-m", "compileall", "-q", *targets)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dry_run_and_a_bad_setting_on_3_12(tiny_config):
    ok = run312("entrypoint.py", "--dry-run", env=clean_env(MODEL_PATH=str(tiny_config)))
    assert ok.returncode == 0, ok.stderr
    assert "vLLM is not installed here" in ok.stdout and "command:" in ok.stdout
    bad = run312("entrypoint.py", env=clean_env(MODEL_PATH=str(tiny_config), TENSOR_PARALLEL_SIZE="3"))
    assert bad.returncode == 2 and "tensor_parallel_size" in bad.stderr


@pytest.mark.server
def test_smoke_probe_on_3_12(server):
    result = run312("healthcheck/probe.py", "smoke", "--url", server.base_url, "--model", server.model,
                    timeout=120)
    assert result.returncode == 0, result.stderr
