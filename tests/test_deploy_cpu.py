"""The CPU image's command line, and every health check the deployment files declare, outside
Docker against the real vLLM CPU server.

No extra server is started here: the session's shared server (tests/conftest.py `server`) is
started as `python entrypoint.py` with MODEL_PATH, PORT and SHARED_SERVER_ENV (the one image host
the image-URL examples need), which is the CPU image's ENTRYPOINT with tini dropped and
/opt/minicpmv-ascend/entrypoint.py mapped to the repo file it is copied from. The first test
proves that claim instead of assuming it: the image's command line with env/cpu.env (MODEL_PATH,
PORT and SHARED_SERVER_ENV set to the shared server's) resolves, in the launcher's dry run, to
exactly the vLLM command line the shared server is running (read from /proc), with the same
runtime environment. So the shared server starting and answering is the CPU image's command line
starting and answering.
"""

from __future__ import annotations

import pathlib
import shlex
import subprocess

import pytest
import yaml

from support.deploy import (
    APP_DIR,
    K8S,
    RUNTIME_ENV_ALLOWLIST,
    copy_map,
    dockerfile_instructions,
    env_mapping,
    exec_form,
    final_stage,
    image_command,
    image_env,
    one,
    render_kustomization,
    server_container,
    to_host,
)
from support.server import REPO, SHARED_SERVER_ENV, clean_env

pytestmark = pytest.mark.server

DOCKERFILE_CPU = REPO / "Dockerfile.cpu"
CPU_ENV = REPO / "env" / "cpu.env"
# Image ENV that describes the container's filesystem, not the server's configuration.
CONTAINER_ONLY_ENV = {"HOME", "PATH", "VIRTUAL_ENV"}


def proc_cmdline(pid: int) -> list[str]:
    return pathlib.Path(f"/proc/{pid}/cmdline").read_text().rstrip("\0").split("\0")


def proc_environ(pid: int) -> dict[str, str]:
    raw = pathlib.Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def cpu_image_argv() -> list[str]:
    files = copy_map(final_stage(dockerfile_instructions(DOCKERFILE_CPU)))
    return to_host(image_command(DOCKERFILE_CPU), files)


def test_cpu_image_command_is_what_the_shared_server_runs(server, tiny_checkpoint) -> None:
    argv = cpu_image_argv()
    # 1. The shared server was started by this very command line (no extra arguments).
    assert list(server.process.args) == argv, (server.process.args, argv)

    # 2. With the image's ENV and env/cpu.env, the launcher plans the command the server runs.
    env = {k: v for k, v in image_env(DOCKERFILE_CPU).items() if k not in CONTAINER_ONLY_ENV}
    env |= {k: v for k, v in env_mapping(CPU_ENV).items() if v}
    env |= {"MODEL_PATH": str(tiny_checkpoint), "PORT": str(server.port), **SHARED_SERVER_ENV}
    result = subprocess.run([*argv, "--dry-run"], env=clean_env(**env), capture_output=True, text=True,
                            timeout=180, cwd=REPO)
    assert result.returncode == 0, result.stderr + result.stdout
    planned = shlex.split(result.stdout.split("command:\n", 1)[1].strip())
    running = proc_cmdline(server.process.pid)  # the launcher exec'd: this PID is vLLM's server
    assert planned == running, f"\nplanned: {planned}\nrunning: {running}"

    # 3. The runtime variables cpu.env sets are what the running server has.
    server_env = proc_environ(server.process.pid)
    for key, value in env_mapping(CPU_ENV).items():
        if key in RUNTIME_ENV_ALLOWLIST:
            assert server_env.get(key) == value, f"{key}: cpu.env {value!r}, server {server_env.get(key)!r}"


def declared_healthchecks() -> dict[str, list[str]]:
    """Every health command of the deployment files, keyed by where it is declared."""
    checks: dict[str, list[str]] = {}
    for name in ("Dockerfile", "Dockerfile.cpu"):
        stage = final_stage(dockerfile_instructions(REPO / name))
        checks[f"{name} HEALTHCHECK"] = next(exec_form(i) for i in stage if i.name == "HEALTHCHECK")
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    for service, spec in compose["services"].items():
        if service in ("lb", "weights"):  # nginx checks itself (tests/test_fleet.py); weights: a one-off download
            continue
        test = spec["healthcheck"]["test"]
        assert test[0] == "CMD", f"{service}: exec form (no shell in the container's health check)"
        checks[f"compose {service}"] = test[1:]
    deployment = one(render_kustomization(K8S / "overlays" / "a2"), "Deployment")
    container = server_container(deployment)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        checks[f"k8s {probe}"] = container[probe]["exec"]["command"]
    return checks


def test_every_declared_health_check_passes_against_the_server(server) -> None:
    """Each command exactly as Docker, compose and Kubernetes run it (the image's Python and file
    paths mapped to this checkout), with the environment the server's container has."""
    files = copy_map(final_stage(dockerfile_instructions(REPO / "Dockerfile")))
    env = clean_env(PORT=str(server.port), SERVED_MODEL_NAME=server.model)
    for where, command in declared_healthchecks().items():
        assert command[1] == f"{APP_DIR}/healthcheck/probe.py", where
        result = subprocess.run(to_host(command, files), env=env, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0, f"{where}: {command}: {result.stderr}"
