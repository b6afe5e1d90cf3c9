"""compose.yaml and env/*.env: the Compose Specification schema, the file as Compose v2 itself
resolves it (`docker compose config`: the NPU devices and driver mounts an Ascend container needs,
docs/design/ascend-stack.md "Running Ascend containers", health checks, the fleet, and the
documented commands and choices run through it), and env files that hold only what the
entrypoint declares (plus an explicit list of runtime variables), set only what differs from the
defaults, and resolve without a configuration error."""

from __future__ import annotations

import itertools
import pathlib
import re
import shlex
import subprocess
from typing import Any

import pytest
import yaml

from minicpmv_ascend import settings
from support.containers import ASCEND_FIRST_HOUR, CHOICES, CPU_WALK, CommandFailed, compose_file_config
from support.deploy import (
    ASCEND_ENV,
    CPU_ENV,
    ENV_DIR,
    RUNTIME_ENV_ALLOWLIST,
    TARGETS_TABLE,
    VLLM_ASCEND_IMAGE_ENV,
    allowed_env_vars,
    declared_env_vars,
    env_files,
    env_mapping,
    lint_tool,
    project_image,
    read_env_file,
    restated_defaults,
    run_tool,
)
from support.server import REPO

COMPOSE = REPO / "compose.yaml"
# What `docker run` needs for one Ascend card: docs/design/ascend-stack.md, "Running Ascend containers".
NPU_CONTROL_DEVICES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
DRIVER_MOUNTS = (
    "/usr/local/dcmi",
    "/usr/local/bin/npu-smi",
    "/usr/local/Ascend/driver/lib64/",
    "/usr/local/Ascend/driver/version.info",
    "/etc/ascend_install.info",
)
# The driver group's id compose requires (`stat -c %g /dev/davinci_manager` on an NPU host).
TEST_GID = "1234"


def compose(**env: str) -> dict[str, Any]:
    """compose.yaml as `docker compose config` resolves it with these variables (and the required
    group id, unless the caller passes HWHIAIUSER_GID itself), every profile on."""
    env.setdefault("HWHIAIUSER_GID", TEST_GID)
    return compose_file_config({k: v for k, v in env.items() if v is not None})


def mounts(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A service's volumes by their path in the container."""
    return {v["target"]: v for v in service.get("volumes", [])}


def devices(service: dict[str, Any]) -> dict[str, str]:
    return {d["source"]: d["target"] for d in service.get("devices", [])}


def published(service: dict[str, Any]) -> list[str]:
    return [f"{p['host_ip']}:{p['published']}:{p['target']}" for p in service.get("ports", [])]


def duration_s(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text))


# --------------------------------------------------------------------------------------------
# compose.yaml
# --------------------------------------------------------------------------------------------


def test_compose_matches_the_compose_specification_schema() -> None:
    result = run_tool(lint_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE))
    assert result.returncode == 0, result.stdout + result.stderr


def test_schema_check_catches_a_mistake(tmp_path: pathlib.Path) -> None:
    """The validator really checks: a misspelt service key is an error."""
    broken = tmp_path / "compose.yaml"
    broken.write_text(COMPOSE.read_text().replace("shm_size:", "shm_sizes:", 1))
    result = run_tool(lint_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(broken))
    assert result.returncode != 0 and "shm_sizes" in result.stdout


@pytest.mark.parametrize("card", ["0", "3"])
def test_ascend_service_has_the_npu_devices_and_driver_mounts(card: str) -> None:
    service = compose(ASCEND_CARD=card)["services"]["minicpmv"]
    assert devices(service) == {f"/dev/davinci{card}": f"/dev/davinci{card}", **{d: d for d in NPU_CONTROL_DEVICES}}
    volumes = mounts(service)
    for path in DRIVER_MOUNTS:
        mount = volumes.get(path.rstrip("/"))
        assert mount and mount["source"] == path and mount["read_only"], f"driver mount {path} missing or writable"


def test_ascend_service_is_the_default_built_from_dockerfile_with_its_env_file() -> None:
    spec = compose()
    service = spec["services"]["minicpmv"]
    assert "profiles" not in service, "the Ascend service is the default one"
    assert service["build"] == {"context": str(REPO), "dockerfile": "Dockerfile", "args": {
        "VLLM_ASCEND_VERSION": TARGETS_TABLE["default"], "ASCEND_TARGET": "a2",
        "VLLM_ASCEND_IMAGE": TARGETS_TABLE["image"], "PIP_INDEX_URL": ""}, "secrets": [{"source": "build_ca"}]}
    assert service["image"] == project_image("a2")
    assert yaml.safe_load(COMPOSE.read_text())["x-npu-server"]["env_file"] == ["env/ascend.env"]
    assert service["environment"] == env_mapping(ASCEND_ENV), "env/ascend.env, and nothing else, reaches the server"
    assert int(service["shm_size"]) >= 2**30, "--shm-size 1g or more (docs/design/ascend-stack.md, Running Ascend containers)"
    assert service["restart"] in ("unless-stopped", "always", "on-failure")
    assert service["group_add"] == [TEST_GID], "the driver's group (HwHiAiUser) for the non-root user"
    assert not service.get("init"), "the image's PID 1 is tini already"
    assert duration_s(service["stop_grace_period"]) >= 30
    # The weights are mounted read-only where MODEL_PATH points.
    models = mounts(service)["/models"]
    assert models["source"] == str(REPO / "models") and models["read_only"]
    assert env_mapping(ASCEND_ENV)["MODEL_PATH"].startswith("/models/")
    # The published port reaches the port the server listens on (the default), on this host only.
    assert published(service) == ["127.0.0.1:8000:8000"]
    assert settings.resolve((), env_mapping(ASCEND_ENV))["port"] == 8000
    assert spec["secrets"]["build_ca"]["file"] == "/dev/null", "no CA bundle unless BUILD_CA_BUNDLE names one"


def test_a3_switches_the_image_and_keeps_the_settings() -> None:
    service = compose(ASCEND_TARGET="a3")["services"]["minicpmv"]
    assert service["build"]["args"]["ASCEND_TARGET"] == "a3"
    assert service["image"] == project_image("a3")
    assert service["environment"] == env_mapping(ASCEND_ENV)


@pytest.mark.parametrize("tag", list(TARGETS_TABLE["targets"]))
def test_one_variable_selects_the_target(tag: str) -> None:
    """VLLM_ASCEND_VERSION picks the base image (build argument) and names the image after it."""
    service = compose(VLLM_ASCEND_VERSION=tag, ASCEND_TARGET="a3")["services"]["minicpmv"]
    assert {k: service["build"]["args"][k] for k in ("VLLM_ASCEND_VERSION", "ASCEND_TARGET")} == \
        {"VLLM_ASCEND_VERSION": tag, "ASCEND_TARGET": "a3"}
    assert service["image"] == project_image("a3", tag)


@pytest.mark.parametrize("name", ["minicpmv", "minicpmv-cpu"])
def test_compose_health_check_runs_the_ready_probe_allowing_a_cold_start(name: str) -> None:
    from minicpmv_ascend import probes

    check = compose()["services"][name]["healthcheck"]
    assert check["test"][0] == "CMD" and check["test"][2:] == ["/opt/minicpmv-ascend/healthcheck/probe.py", "ready"]
    assert duration_s(check["start_period"]) >= 600, "a cold start takes minutes"
    assert duration_s(check["timeout"]) > probes.DEFAULT_TIMEOUT["ready"], \
        "the probe must report its own timeout before Docker kills it"
    assert check["retries"] >= 2


def test_cpu_service_is_a_profile_built_from_dockerfile_cpu_with_its_env_file() -> None:
    service = compose()["services"]["minicpmv-cpu"]
    assert service["profiles"] == ["cpu"]
    assert service["build"]["dockerfile"] == "Dockerfile.cpu"
    assert service["build"]["args"] == {"PYTHON_IMAGE": "python:3.11-slim-bookworm",
                                        "TORCH_INDEX_URL": "https://download.pytorch.org/whl/cpu"}
    assert service["build"]["secrets"] == [{"source": "build_ca"}]
    assert yaml.safe_load(COMPOSE.read_text())["services"]["minicpmv-cpu"]["env_file"] == ["env/cpu.env"]
    assert service["environment"] == {**env_mapping(CPU_ENV), "MODEL_PATH": ""}, "empty: the random tiny model"
    assert "devices" not in service
    models = mounts(service)["/models"]
    assert models["source"] == str(REPO / "models") and models["read_only"]
    assert mounts(service)["/home/minicpmv/.cache"]["type"] == "volume"


def test_the_weights_service_downloads_into_model_dir_with_the_servers_image() -> None:
    """`docker compose run --rm weights`: the script of the image the server runs, MODEL_DIR mounted
    writable at /models (the server's mount is read-only), the host folder named for the hint, and
    no device, port or group: it is not a server."""
    services = compose(MODEL_DIR="/srv/models")["services"]
    weights = services["weights"]
    assert weights["profiles"] == ["weights"] and weights["image"] == services["minicpmv"]["image"]
    assert weights["entrypoint"] == ["/opt/minicpmv-ascend/scripts/download_weights.sh"]
    assert weights.get("command") is None, "the folder is MODEL_DIR's: `--model X` alone must do"
    assert weights["environment"] == {"MODEL_DIR": "/models", "MODEL_DIR_ON_HOST": "/srv/models"}
    models = mounts(weights)["/models"]
    assert models["source"] == "/srv/models" and not models.get("read_only")
    assert mounts(services["minicpmv"])["/models"]["read_only"]
    assert not {"devices", "ports", "group_add", "healthcheck"} & set(weights)


def test_the_driver_group_is_required_not_defaulted() -> None:
    """No silent 1000: compose stops on every command until HWHIAIUSER_GID is set, and says where
    the number comes from (the device node, right even with a custom driver user)."""
    with pytest.raises(CommandFailed, match=r"HWHIAIUSER_GID.*stat -c %g /dev/davinci_manager"):
        compose(HWHIAIUSER_GID=None)
    raw = COMPOSE.read_text()
    assert "HWHIAIUSER_GID:-" not in raw and "${HWHIAIUSER_GID:?" in raw
    assert compose(HWHIAIUSER_GID="993")["services"]["npu5"]["group_add"] == ["993"]


def test_ports_are_published_on_this_host_only_unless_asked() -> None:
    """No API key by default: the port stays on 127.0.0.1 until BIND_ADDRESS opens it."""
    for name, service in compose()["services"].items():
        for port in published(service):
            assert port.startswith("127.0.0.1:"), (name, port)
    exposed = compose(BIND_ADDRESS="0.0.0.0", LB_PORT="9000")["services"]
    assert published(exposed["minicpmv"]) == ["0.0.0.0:8000:8000"]
    assert published(exposed["lb"]) == ["0.0.0.0:9000:8080"]


def test_base_images_indexes_and_ca_are_build_arguments_the_dockerfiles_declare(tmp_path) -> None:
    """Where quay.io, Docker Hub or PyPI are slow, blocked or behind the site's own CA: a mirror of
    each base image, a pip index, torch's CPU index and a CA bundle, from compose."""
    from support.deploy import dockerfile_instructions

    def declared(dockerfile: str) -> set[str]:
        return {ins.args.partition("=")[0].strip() for ins in dockerfile_instructions(REPO / dockerfile)
                if ins.name == "ARG"}

    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    spec = compose(VLLM_ASCEND_IMAGE="m.daocloud.io/quay.io/ascend/vllm-ascend", PIP_INDEX_URL="https://pypi.org/simple",
                   PYTHON_IMAGE="docker.m.daocloud.io/library/python:3.11-slim-bookworm",
                   TORCH_INDEX_URL="https://mirror.example/whl/cpu", BUILD_CA_BUNDLE=str(ca))
    args = spec["services"]["minicpmv"]["build"]["args"]
    assert args["VLLM_ASCEND_IMAGE"] == "m.daocloud.io/quay.io/ascend/vllm-ascend"
    assert args["PIP_INDEX_URL"] == "https://pypi.org/simple"
    assert set(args) <= declared("Dockerfile")
    cpu = spec["services"]["minicpmv-cpu"]["build"]["args"]
    assert cpu == {"PYTHON_IMAGE": "docker.m.daocloud.io/library/python:3.11-slim-bookworm",
                   "TORCH_INDEX_URL": "https://mirror.example/whl/cpu"}
    assert set(cpu) <= declared("Dockerfile.cpu")
    assert spec["secrets"]["build_ca"]["file"] == str(ca)


FLEET = ["minicpmv", *(f"npu{n}" for n in range(1, 8))]


def test_fleet_profile_one_server_per_card_behind_the_balancer() -> None:
    services = compose(HWHIAIUSER_GID="993")["services"]
    cards = []
    for name in FLEET:
        service = services[name]
        names = set(devices(service))
        (card,) = names - set(NPU_CONTROL_DEVICES)
        cards.append(card)
        assert names - {card} == set(NPU_CONTROL_DEVICES), name
        assert service["group_add"] == ["993"], name
        # The same server as `minicpmv` but for its card, its profile, its (absent) port, and the
        # build, which `minicpmv` alone does (the same image, built once).
        same = {k: v for k, v in service.items() if k not in ("devices", "profiles", "ports", "build")}
        assert same == {k: v for k, v in services["minicpmv"].items() if k not in ("devices", "ports", "build")}, name
        assert service.get("profiles") == (None if name == "minicpmv" else ["fleet"])
        assert ("build" in service) == (name == "minicpmv"), name
    assert cards == [f"/dev/davinci{n}" for n in range(8)], "eight distinct cards"
    assert published(services["minicpmv"]) == ["127.0.0.1:8000:8000"]
    lb = services["lb"]
    assert lb["profiles"] == ["fleet"] and sorted(lb["depends_on"]) == sorted(FLEET)
    conf = mounts(lb)["/etc/nginx/nginx.conf"]
    assert conf["source"] == str(REPO / "deploy" / "compose" / "nginx-fleet.conf") and conf["read_only"]
    assert "unprivileged" in lb["image"], "nginx as a non-root user"
    text = (REPO / "deploy" / "compose" / "nginx-fleet.conf").read_text()
    assert re.findall(r"^\s*server (\w+):8000 ", text, re.M) == FLEET
    assert "listen 8080;" in text and published(lb) == ["127.0.0.1:8080:8080"]


def test_env_files_referenced_by_compose_exist() -> None:
    raw = yaml.safe_load(COMPOSE.read_text())
    for path in [*raw["x-npu-server"]["env_file"], *raw["services"]["minicpmv-cpu"]["env_file"]]:
        assert (REPO / path).is_file(), path


def test_the_default_model_path_is_env_ascend_env_s() -> None:
    """compose passes MODEL_PATH from .env (where the 4.7 choice puts it); without one, the
    env file's value, which Kubernetes reads: the two defaults are one value."""
    assert compose()["services"]["minicpmv"]["environment"]["MODEL_PATH"] == env_mapping(ASCEND_ENV)["MODEL_PATH"]


# --------------------------------------------------------------------------------------------
# The documented commands and choices, as Compose resolves them for each command
# --------------------------------------------------------------------------------------------


def as_seen_by(command: str, workdir: pathlib.Path) -> dict[str, Any]:
    """compose.yaml as one documented `docker compose` command line sees it: the variables it sets
    for itself (`VAR=value docker compose ...`) and the .env the earlier lines wrote."""
    words = shlex.split(command)
    assignments = dict(w.split("=", 1) for w in itertools.takewhile(lambda w: re.match(r"\w+=", w), words))
    assert words[len(assignments):len(assignments) + 2] == ["docker", "compose"], command
    return compose_file_config(assignments, dotenv=workdir / ".env")


def run_lines(lines: list[str], workdir: pathlib.Path) -> None:
    """The lines that write .env, run in bash in `workdir` (the GID line's `stat` gets a fake /dev)."""
    for line in lines:
        subprocess.run(["bash", "-c", line.replace("stat -c %g /dev/davinci_manager", f"echo {TEST_GID}")],
                       cwd=workdir, check=True)


@pytest.mark.parametrize("choice", list(CHOICES))
def test_a_choice_made_once_holds_for_build_up_and_ps(choice: str, tmp_path) -> None:
    """The first hour's commands after one documented choice: `build` tags the image `up` runs and
    `ps` shows, and what the choice sets reaches the server (4.7: its MODEL_PATH)."""
    run_lines([ASCEND_FIRST_HOUR["gid"], CHOICES[choice]], tmp_path)
    seen = {name: as_seen_by(ASCEND_FIRST_HOUR[name], tmp_path)["services"]["minicpmv"]
            for name in ("build", "up", "ps", "down")}
    weights = as_seen_by(ASCEND_FIRST_HOUR["weights"], tmp_path)["services"]["weights"]
    tag = {"a3": TARGETS_TABLE["default"], "v0.23.0": "v0.23.0", "minicpm-v-4.7": "v0.32.0rc1"}[choice]
    variant = "a3" if choice == "a3" else "a2"
    for name, service in seen.items():
        assert service["image"] == project_image(variant, tag), name
        assert service["build"]["args"]["VLLM_ASCEND_VERSION"] == tag and service["build"]["args"]["ASCEND_TARGET"] == variant
        assert service["group_add"] == [TEST_GID]
    assert weights["image"] == project_image(variant, tag), "the download runs the image build made"
    model = seen["up"]["environment"]["MODEL_PATH"]
    assert model == ("/models/MiniCPM-V-4.7-1B" if choice == "minicpm-v-4.7" else env_mapping(ASCEND_ENV)["MODEL_PATH"])


def test_a_variable_given_to_one_command_only_is_the_trap_the_choices_avoid(tmp_path) -> None:
    """The old way, `ASCEND_TARGET=a3 docker compose build` then `docker compose up -d minicpmv`:
    `up` runs (or builds) the A2 image. What the choice test above would see without .env."""
    run_lines([ASCEND_FIRST_HOUR["gid"]], tmp_path)
    built = as_seen_by("ASCEND_TARGET=a3 docker compose build", tmp_path)["services"]["minicpmv"]["image"]
    ran = as_seen_by(ASCEND_FIRST_HOUR["up"], tmp_path)["services"]["minicpmv"]["image"]
    assert (built, ran) == (project_image("a3"), project_image("a2"))


def test_the_cpu_walk_resolves_with_its_gid_line(tmp_path) -> None:
    run_lines([CPU_WALK["gid"]], tmp_path)
    for name in ("up", "ps", "logs", "stop", "down"):
        service = as_seen_by(CPU_WALK[name], tmp_path)["services"]["minicpmv-cpu"]
        assert service["image"] == "minicpmv-ascend:cpu" and service["environment"]["MODEL_PATH"] == ""


# --------------------------------------------------------------------------------------------
# env/*.env
# --------------------------------------------------------------------------------------------


def test_one_env_file_per_platform_and_one_for_every_ascend_deployment() -> None:
    """A2 and A3 take the same settings: one file. compose and docker run read env/ascend.env,
    which is the Kubernetes base's serving.env (a symlink: kustomize reads no file outside its
    directory, compose and docker read any), so the two cannot drift apart."""
    assert [p.name for p in env_files()] == ["ascend.env", "cpu.env"]
    link = ENV_DIR / "ascend.env"
    assert link.is_symlink() and link.resolve() == ASCEND_ENV.resolve(), "env/ascend.env is not the k8s base's file"


@pytest.mark.parametrize("path,platform", [(ASCEND_ENV, "ascend"), (CPU_ENV, "cpu")], ids=["ascend", "cpu"])
def test_env_file_sets_only_what_differs_from_the_defaults(path: pathlib.Path, platform: str, tiny_config) -> None:
    """Every default lives in one place (minicpmv_ascend.settings, and the launcher's and the
    images' environment): an env file that repeats one would have to change with it."""
    assert restated_defaults(path, platform, tiny_config) == []


def test_the_restatement_check_catches_each_kind(tmp_path: pathlib.Path, tiny_config) -> None:
    env = tmp_path / "restating.env"
    env.write_text("# comment for each\nMODEL_PATH=/models/x\nASCEND_RT_VISIBLE_DEVICES=0\nMAX_MODEL_LEN=4096\n"
                   "MAX_NUM_SEQS=16\nLIMIT_MM_PER_PROMPT={\"video\":2,\"image\":5}\nENFORCE_EAGER=true\n"
                   "API_KEY_FILE=\nHF_HUB_OFFLINE=1\nTASK_QUEUE_ENABLE=1\nPORT=8000\nOMP_PROC_BIND=false\n")
    found = {int(p.split(":")[1]): p for p in restated_defaults(env, "ascend", tiny_config)}
    expected = {5: "the default of `max_num_seqs`", 6: "the default of `limit_mm_per_prompt`",
                7: "the default of `enforce_eager`", 8: "an empty value", 9: "the launcher sets it",
                10: "the image's ENV", 11: "the default of `port`"}
    assert sorted(found) == sorted(expected), found  # MODEL_PATH, the devices, 4096, OMP_PROC_BIND differ
    for line, why in expected.items():
        assert why in found[line], found[line]

@pytest.mark.parametrize("path", env_files(), ids=lambda p: p.name)
def test_env_file_holds_only_declared_settings_and_listed_runtime_variables(path: pathlib.Path) -> None:
    allowed = allowed_env_vars()
    entries = read_env_file(path)
    keys = [e.key for e in entries]
    assert len(keys) == len(set(keys)), f"duplicate keys in {path.name}"
    unknown = sorted(set(keys) - allowed)
    assert not unknown, (f"{path.name} sets {unknown}: neither a setting of the entrypoint "
                         "(minicpmv_ascend.settings) nor in RUNTIME_ENV_ALLOWLIST")


@pytest.mark.parametrize("path", env_files(), ids=lambda p: p.name)
def test_every_variable_is_commented(path: pathlib.Path) -> None:
    for entry in read_env_file(path):
        words = " ".join(line.lstrip("# ") for line in entry.comment)
        assert len(words.split()) >= 4, f"{path.name}:{entry.line}: {entry.key} has no comment above it"


def test_runtime_allowlist_is_explained_and_does_not_shadow_settings() -> None:
    assert not set(RUNTIME_ENV_ALLOWLIST) & declared_env_vars()
    assert all(len(reason.split()) >= 4 for reason in RUNTIME_ENV_ALLOWLIST.values())


def test_ascend_env_file_carries_the_rope_workaround_and_tutorial_runtime_values() -> None:
    import json

    env = env_mapping(ASCEND_ENV)
    overrides = json.loads(env["HF_OVERRIDES"])
    # Nested under text_config, or the plain rotary embedding still crashes
    # (docs/design/ascend-stack.md, known problem 6).
    assert overrides == {"text_config": {"rope_parameters": {"mrope_section": [11, 11, 10],
                                                             "mrope_interleaved": True}}}
    assert env["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True" and env["OMP_PROC_BIND"] == "false"
    # What the tutorials also set, the base image does: its ENV, not repeated in the file.
    assert {"TASK_QUEUE_ENABLE": "1", "OMP_NUM_THREADS": "1"}.items() <= VLLM_ASCEND_IMAGE_ENV.items()
    resolved = settings.resolve((), env)
    assert resolved["enable_prefix_caching"] is False, "hybrid-model prefix caching is experimental on Ascend"
    assert resolved["tensor_parallel_size"] == 1 and resolved["enforce_eager"] is True


@pytest.mark.parametrize("path,platform", [(ASCEND_ENV, "ascend"), (CPU_ENV, "cpu")], ids=["ascend", "cpu"])
def test_env_file_resolves_without_a_configuration_error(path: pathlib.Path, platform: str, tiny_config) -> None:
    """The settings module's own resolution and checks (types, ranges, devices, dtype, checkpoint),
    on the platform the file is for. vLLM's parser checks the Ascend values in
    test_deploy_images.py::test_ascend_image_command_outside_docker_dry_run, cpu.env's in
    test_deploy_cpu.py."""
    from minicpmv_ascend import settings

    env = {k: v for k, v in env_mapping(path).items()}
    if env.get("MODEL_PATH"):
        env["MODEL_PATH"] = str(tiny_config)  # the directory the container would mount
    resolution = settings.resolve((), env)
    for entry in read_env_file(path):
        setting = next((s for s in settings.SETTINGS if s.env == entry.key), None)
        if setting is not None and entry.value:
            assert resolution.values[setting.name].source == "env", entry.key
    plan = settings.build_plan(resolution, env, platform)
    assert plan.platform == platform and plan.model
