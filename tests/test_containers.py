"""`docker compose up` for real: a real Docker engine builds both images with no registry
reachable, Compose v2 runs the documented commands, and the service answers from its container.

The container phase of `make test` (the CPU walk, and the default Ascend target's image) and
`make test-containers` (every target), in one pytest process of their own (marker `container`),
never beside the shared vLLM servers. tests/support/containers.py has the engine, the base images
made here, and what stands in for what; the walk's commands are CPU_WALK below, the same lines as
the docs (tests/test_docs.py keeps them equal), run in a copy of this checkout with only the
test override added (COMPOSE_FILE: host network, a free port on 127.0.0.1, a 5 s health interval).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import shlex
import shutil
import signal
import time

import pytest

from minicpmv_ascend.tools.lifecycle import free_port
from support.ascend_stand_in import HAL_ERROR
from support.containers import (
    ASCEND_FIRST_HOUR,
    CPU_WALK,
    HOST_CA_BUNDLE,
    PROJECT,
    README_CURL,
    TARGETS_TABLE,
    CommandFailed,
    client_env,
    compose_file_config,
    disk_use,
    docker,
    find_or_start_engine,
    make_python_base,
    make_vllm_ascend_stand_in,
    project_copy,
    project_leftovers,
    run,
    service_health,
    step,
    torch_index,
)
from support.deploy import ASCEND_ENV, FAKE_MODELSCOPE, env_mapping, project_image
from support.raw_http import send

pytestmark = pytest.mark.container

SERVICE = "minicpmv-cpu"
HEALTHY_TIMEOUT_S = 900  # a bound, not a budget: 60-100 s measured on a 2-core machine
STOP_GRACE_S = 60  # compose.yaml's stop_grace_period of the service
# Which Ascend targets' images to build: "default" (make test) or "all" (make test-containers).
CONTAINER_TARGETS = os.environ.get("CONTAINER_TARGETS", "default")


def ascend_images() -> list[tuple[str, str]]:
    """(target, variant) of the Ascend images to build: the default's A2 image, or every target's
    A2 image and the default's A3 one."""
    default = TARGETS_TABLE["default"]
    if CONTAINER_TARGETS == "all":
        return [*((tag, "a2") for tag in TARGETS_TABLE["targets"]), (default, "a3")]
    return [(default, "a2")]


# --------------------------------------------------------------------------------------------
# The engine, the base images, the project copy
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("containers")


@pytest.fixture(scope="session")
def engine(workdir):
    """The engine for the session; at its end the project's containers, volumes and images go
    (and the engine with its data root, when the tests started it), their sizes printed first."""
    # A SIGTERM (make's timeout) tears the session down like Ctrl-C, instead of leaving dockerd.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with step("engine"):
        engine = find_or_start_engine(workdir)
    yield engine
    env = client_env(engine, workdir)
    with step("clean up"):
        print(f"== what the engine holds before the clean-up:\n{disk_use(env)}", flush=True)
        for container in project_leftovers(env)["containers"]:
            docker(env, "rm", "--force", "--volumes", container, check=False)
        for volume in project_leftovers(env)["volumes"]:
            docker(env, "volume", "rm", "--force", volume, check=False)
        made = docker(env, "images", "--format", "{{.Repository}}:{{.Tag}}", check=False).stdout.split()
        ours = [i for i in made if i.startswith(("minicpmv-ascend:", "minicpmv-kit-test/"))]
        if ours:
            docker(env, "rmi", "--force", *ours, check=False)
        if not engine.own:
            print("== the engine was running before the tests: its build cache is left as it is", flush=True)
        engine.stop()


@pytest.fixture(scope="session")
def project(workdir) -> pathlib.Path:
    """A copy of the checkout (what a clone holds) in which every documented command runs."""
    return project_copy(workdir / "project")


@pytest.fixture(scope="session")
def base_env(engine, workdir):
    """The client environment, with the bases made and the torch index up for the builds."""
    env = client_env(engine, workdir, KIT_TEST_PORT=str(free_port()), BUILD_CA_BUNDLE=str(HOST_CA_BUNDLE))
    with step("debootstrap base"):
        env["PYTHON_IMAGE"] = make_python_base(env, workdir)
    with torch_index(workdir) as url:
        env["TORCH_INDEX_URL"] = url
        yield env


# --------------------------------------------------------------------------------------------
# The CPU walk
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cpu_walk(base_env, project):
    """Builds the CPU image with the build command of compose, then runs the walk's first lines;
    at the end the walk's last line (down) runs even when a test failed."""
    env = dict(base_env)
    run(CPU_WALK["gid"], env, cwd=project)
    with step("CPU image build"):
        run("docker compose build minicpmv-cpu", env, cwd=project, timeout=2400)
    with step("CPU up to healthy"):
        run(CPU_WALK["up"], env, cwd=project, timeout=300)
        deadline = time.monotonic() + HEALTHY_TIMEOUT_S
        while (health := service_health(env, project, SERVICE)) != ("running", "healthy"):
            if health[0] != "running" or time.monotonic() > deadline:
                logs = run(CPU_WALK["logs"], env, cwd=project, check=False).stdout[-5000:]
                pytest.fail(f"{SERVICE} is {health}, not healthy:\n{logs}")
            time.sleep(2)
    yield env
    run(CPU_WALK["down"], env, cwd=project, timeout=300, check=False)  # also after a failed test


def base_url(env) -> str:
    return f"http://127.0.0.1:{env['KIT_TEST_PORT']}"


def test_ps_reports_the_service_healthy(cpu_walk, project) -> None:
    out = run(CPU_WALK["ps"], cpu_walk, cwd=project).stdout
    line = next(row for row in out.splitlines() if SERVICE in row)
    assert "(healthy)" in line, out


def test_the_readme_curl_answers_from_the_host(cpu_walk, project) -> None:
    curl = README_CURL.replace("localhost:8000", f"localhost:{cpu_walk['KIT_TEST_PORT']}")
    answer = json.loads(run(curl, cpu_walk, cwd=project).stdout)
    message = answer["choices"][0]["message"]
    assert answer["model"] == "minicpm-v-4.6-thinking" and answer["usage"]["completion_tokens"] > 0
    assert message["content"] is not None or message["reasoning"] is not None, answer


def test_an_image_by_data_url_answers_from_the_host(cpu_walk, project) -> None:
    """examples/curl/image_base64.sh (its red square, sent inline) against the container."""
    result = run(f"BASE_URL={base_url(cpu_walk)}/v1 MAX_TOKENS=16 examples/curl/image_base64.sh 'What colour?'",
                 cpu_walk, cwd=project, timeout=120)
    assert result.returncode == 0 and result.stdout.strip(), result.stderr


def test_the_probes_pass_inside_the_container(cpu_walk, project) -> None:
    for probe in ("live", "ready"):
        run(CPU_WALK["smoke"].replace(" smoke", f" {probe}"), cpu_walk, cwd=project, timeout=60)
    smoke = run(CPU_WALK["smoke"], cpu_walk, cwd=project, timeout=300)
    assert smoke.stdout.startswith("smoke ok:"), smoke.stdout + smoke.stderr


def test_the_logs_say_the_plugin_applied_and_the_model_is_random(cpu_walk, project) -> None:
    logs = run(CPU_WALK["logs"], cpu_walk, cwd=project).stdout
    assert "minicpmv_ascend_plugin" in logs and "applied: " in logs, logs[-3000:]
    assert "RANDOM-WEIGHT" in logs


def test_non_root_with_the_models_read_only_and_the_cache_writable(cpu_walk, project) -> None:
    container = f"{PROJECT}-{SERVICE}-1"
    users = {line.split()[1] for line in docker(cpu_walk, "top", container, "-eo", "pid,uid").stdout.splitlines()[1:]}
    assert users == {"1000"}, f"every process of the container runs as uid 1000: {users}"
    mounts = {m["Destination"]: m for m in json.loads(docker(cpu_walk, "inspect", container).stdout)[0]["Mounts"]}
    assert mounts["/models"]["RW"] is False and mounts["/home/minicpmv/.cache"]["RW"] is True
    assert mounts["/home/minicpmv/.cache"]["Type"] == "volume"
    writes = "touch /home/minicpmv/.cache/probe && ! touch /models/probe 2>/dev/null && echo writes-as-documented"
    exec_ = run(f"docker compose exec {SERVICE} sh -c '{writes}'", cpu_walk, cwd=project)
    assert exec_.stdout.strip() == "writes-as-documented"


def chat(url: str, max_tokens: int) -> tuple[int, dict]:
    status, body = send(f"{url}/v1/chat/completions", {
        "model": "minicpm-v-4.6-thinking", "messages": [{"role": "user", "content": "Count slowly."}],
        "max_tokens": max_tokens, "ignore_eos": True}, timeout=STOP_GRACE_S + 30)
    return status, json.loads(body)


def running_requests(url: str) -> float:
    status, body = send(f"{url}/metrics", timeout=10)
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
               if line.startswith("vllm:num_requests_running"))


def test_stop_answers_the_requests_in_flight_then_exits_0(cpu_walk, project) -> None:
    """`docker compose stop` sends SIGTERM: vLLM drains (SHUTDOWN_TIMEOUT) and every request in
    flight gets its whole answer; the container exits 0 within the grace period."""
    url, in_flight = base_url(cpu_walk), 3
    with concurrent.futures.ThreadPoolExecutor(in_flight) as pool:
        answers = [pool.submit(chat, url, 400) for _ in range(in_flight)]
        deadline = time.monotonic() + 60
        while running_requests(url) < in_flight:
            assert time.monotonic() < deadline, "the requests never ran together"
            time.sleep(0.2)
        with step("CPU stop, in flight"):
            start = time.monotonic()
            run(CPU_WALK["stop"], cpu_walk, cwd=project, timeout=STOP_GRACE_S + 60)
            stopped_after = time.monotonic() - start
        results = [a.result() for a in answers]
    for status, body in results:
        assert status == 200, body
        assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 400
    state = json.loads(docker(cpu_walk, "inspect", f"{PROJECT}-{SERVICE}-1").stdout)[0]["State"]
    assert state["Status"] == "exited" and state["ExitCode"] == 0, state
    assert stopped_after < STOP_GRACE_S, f"stopped after {stopped_after:.0f} s: killed at the grace period"


def test_down_leaves_nothing(cpu_walk, project) -> None:
    with step("CPU down"):
        run(CPU_WALK["down"], cpu_walk, cwd=project, timeout=300)
    assert project_leftovers(cpu_walk) == {"containers": [], "volumes": []}


# --------------------------------------------------------------------------------------------
# The Ascend image on the stand-in base
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def stand_ins() -> dict[str, str]:
    """The stand-in vllm-ascend image of each target built so far: its repository (both variants)."""
    return {}


@pytest.mark.parametrize("tag, variant", ascend_images())
def test_the_ascend_image_builds_on_the_stand_in_base(base_env, project, workdir, tiny_config, stand_ins, tag,
                                                      variant) -> None:
    """Built with the documented `docker compose build`, the target chosen in .env; the build
    decides and records its transformers (the stand-in has the base image's own where the table
    knows it: v0.23.0's 5.5.4, without MiniCPM-V 4.6, is replaced by the pin; otherwise the lock's,
    kept), and the image's entrypoint (tini, CANN's environment, the launcher) reads
    env/ascend.env and the mounted checkpoint, then refuses to start without the NPU driver, with
    the launcher's message (the stand-in torch_npu fails as the real one does)."""
    env, target = dict(base_env), TARGETS_TABLE["targets"][tag]
    model = workdir / "model"
    if not model.exists():
        shutil.copytree(tiny_config, model)
        run(["chmod", "-R", "a+rX", str(model)], env)  # read by the image's uid 1000
    if tag not in stand_ins:
        with step(f"stand-in {tag}"):
            stand_ins[tag] = make_vllm_ascend_stand_in(env, workdir, tag, env["TORCH_INDEX_URL"])
    env["VLLM_ASCEND_IMAGE"] = stand_ins[tag]
    (project / ".env").write_text(f"HWHIAIUSER_GID=none\nVLLM_ASCEND_VERSION={tag}\nASCEND_TARGET={variant}\n")
    with step(f"Ascend {tag}-{variant}"):
        run("docker compose build minicpmv", env, cwd=project, timeout=2400)
    image = compose_file_config({}, dotenv=project / ".env")["services"]["minicpmv"]["image"]
    assert image == project_image(variant, tag)
    record = json.loads(docker(env, "run", "--rm", "--network", "none", "--entrypoint", "cat", image,
                               "/opt/minicpmv-ascend/build/transformers-decision.json").stdout)
    assert (record["target"], record["variant"], record["vllm"]) == (tag, variant, target["vllm"]), record
    assert record["decision"] == ("install" if target.get("base_transformers") else "keep"), record
    started = docker(env, "run", "--rm", "--network", "none", "--env-file", str(project / "env" / "ascend.env"),
                     "--volume", f"{model}:{env_mapping(ASCEND_ENV)['MODEL_PATH']}:ro", image, "--dry-run",
                     check=False)
    assert started.returncode == 2, started.stdout + started.stderr
    assert "with-cann-env.sh" not in started.stderr, "CANN's environment was set up"
    assert "configuration error in `NPU driver`" in started.stderr and HAL_ERROR in started.stderr, started.stderr
    the_weights_service_downloads_into_models(env, project, workdir, model)


def the_weights_service_downloads_into_models(env, project: pathlib.Path, workdir: pathlib.Path,
                                              checkpoint: pathlib.Path) -> None:
    """The first hour's `docker compose run --rm weights`: the image's own download script, as the
    image's user, refuses a folder only the host's root may write, naming it, and after the
    documented `install -d` writes into ./models files the server reads.
    The stand-in base has no modelscope and no hub is reachable: a stand-in CLI, mounted, copies
    the tiny checkpoint (what it cannot show: the real CLI and ModelScope)."""
    hub = workdir / "hub"
    shutil.rmtree(hub, ignore_errors=True)
    shutil.copytree(checkpoint, hub / "model")
    (hub / "modelscope").write_text(FAKE_MODELSCOPE.format(python="/usr/bin/env python3"))
    run(["chmod", "-R", "a+rX,a+x", str(hub)], env)
    models = project / "models"
    shutil.rmtree(models, ignore_errors=True)
    models.mkdir(mode=0o755)  # as the host's root makes it (or compose, mounting a missing folder)
    *command, service = shlex.split(ASCEND_FIRST_HOUR["weights"])
    stand_in = ["--volume", f"{hub}:/hub:ro", "--env", "MODELSCOPE=/hub/modelscope",
                "--env", "FAKE_MODELSCOPE_SOURCE=/hub/model", "--env", "FAKE_MODELSCOPE_LOG=/tmp/modelscope-args.json"]
    download = shlex.join([*command, *stand_in, service])
    try:
        refused = run(download, env, cwd=project, timeout=300, check=False)
        assert refused.returncode == 2 and "cannot write to /models/MiniCPM-V-4.6-Thinking as uid 1000" in \
            refused.stderr, refused.stdout + refused.stderr
        run(ASCEND_FIRST_HOUR["models"], env, cwd=project)
        result = run(download, env, cwd=project, timeout=300)
        dest = models / "MiniCPM-V-4.6-Thinking"
        assert "== done" in result.stdout and "MODEL_DIR=./models docker compose up -d minicpmv" in result.stdout, \
            result.stdout
        files = sorted(p.name for p in dest.iterdir())
        assert files == sorted(p.name for p in checkpoint.iterdir()), files
        assert all(p.stat().st_mode & 0o004 for p in dest.iterdir()), "readable by the server's UID 1000"
    finally:
        shutil.rmtree(models, ignore_errors=True)


def test_the_builds_download_through_the_ca_bundle_they_are_given(base_env, project, workdir) -> None:
    """The planted fault: the CPU image built without its cache (`docker build`, the secret as the
    Dockerfile's header gives it) with a CA bundle that signed nothing fails at its first pip
    download: the `build_ca` secret is what the builds' pip trusts. (Compose 2.40.3 without buildx
    ignores `build --no-cache`: every step came from the cache.)"""
    if CONTAINER_TARGETS != "all":
        pytest.skip("make test-containers runs it (a build without its cache: about a minute)")
    bogus = workdir / "not-the-sites-ca.pem"
    run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=signed nothing",
         "-keyout", str(workdir / "not-the-sites-ca.key"), "-out", str(bogus)], base_env)
    with pytest.raises(CommandFailed, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        docker(base_env, "build", "--no-cache", "--network", "host", "--secret", f"id=build_ca,src={bogus}",
               "--build-arg", f"PYTHON_IMAGE={base_env['PYTHON_IMAGE']}",
               "--build-arg", f"TORCH_INDEX_URL={base_env['TORCH_INDEX_URL']}",
               "--file", str(project / "Dockerfile.cpu"), "--tag", "minicpmv-kit-test/no-ca:cpu", str(project),
               timeout=1200)
