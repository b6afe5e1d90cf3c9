"""The two images, without a Docker engine: hadolint, what each Dockerfile must contain, the CANN
exec wrapper of the Ascend image run against a fake CANN tree, and both images' command lines run
outside Docker (the Ascend one through the wrapper in --dry-run; the CPU one against the shared
vLLM server, see test_cpu_image_command_is_what_the_shared_server_runs)."""

from __future__ import annotations

import itertools
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

from support.ascend_stand_in import HAL_ERROR, cann_tree, npu_without_driver
from support.deploy import (
    APP_DIR,
    ASCEND_ENV,
    DOCKERFILES,
    TARGETS_TABLE,
    build_args,
    copy_map,
    dockerfile_instructions,
    env_mapping,
    exec_form,
    expand,
    final_stage,
    image_command,
    image_env,
    lint_tool,
    run_script,
    run_tool,
    shell_commands,
    stage_args,
    to_host,
)
from support.server import REPO, clean_env

WRAPPER = REPO / "deploy" / "docker" / "with-cann-env.sh"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_finds_nothing_in_the_dockerfiles(name: str) -> None:
    """hadolint with its default rules, any finding fails (ignores are inline, each with a reason)."""
    result = run_tool(lint_tool("hadolint"), "--no-color", str(DOCKERFILES[name]))
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: pathlib.Path) -> None:
    """The linter really runs: an unpinned base and `cd` in RUN are reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN cd /tmp && ls\n")
    result = run_tool(lint_tool("hadolint"), "--no-color", str(bad))
    assert result.returncode != 0 and "DL3006" in result.stdout and "DL3003" in result.stdout


def test_the_dockerfiles_need_no_registry_for_their_frontend() -> None:
    """A `# syntax=` line makes BuildKit pull its frontend image from Docker Hub before anything
    else: no registry, no build. Docker's built-in frontend builds RUN --mount and secrets."""
    for name in ("Dockerfile", "Dockerfile.cpu", "tests/containers/vllm-ascend-stand-in.Dockerfile"):
        lines = (REPO / name).read_text().splitlines()
        # Parser directives: the `# key=value` lines at the very top, before any other line.
        directives = itertools.takewhile(lambda line: re.match(r"#\s*\w+\s*=", line), lines)
        assert not [d for d in directives if re.match(r"#\s*syntax\s*=", d, re.IGNORECASE)], name


def test_ascend_base_is_the_pinned_official_image_with_an_a3_variant() -> None:
    """The defaults are the table's (deploy/ascend-targets.yaml): its image and default target; the
    a3 stage adds the table's suffix for a3, the a2 stage none; one build argument
    (VLLM_ASCEND_VERSION) selects any other target, and with it its own transformers pin: the
    TRANSFORMERS_VERSION default is empty (the decision reads the target's pin from the table)."""
    instructions = dockerfile_instructions(DOCKERFILES["ascend"])
    args = build_args(instructions)
    assert args["VLLM_ASCEND_IMAGE"] == TARGETS_TABLE["image"]
    assert args["VLLM_ASCEND_VERSION"] == TARGETS_TABLE["default"]
    assert args["ASCEND_TARGET"] == "a2" and set(TARGETS_TABLE["variants"]) == {"a2", "a3"}
    assert TARGETS_TABLE["variants"] == {"a2": "", "a3": "-a3"}
    assert args["TRANSFORMERS_VERSION"] == "", "a fixed default would be one target's pin for every target"
    pins = {tag: target["transformers_pin"] for tag, target in TARGETS_TABLE["targets"].items()}
    assert len(set(pins.values())) > 1, pins  # why it is decided per target (v0.32.0rc1: 5.19.0)
    froms = [i.args for i in instructions if i.name == "FROM"]
    assert froms == [
        "${VLLM_ASCEND_IMAGE}:${VLLM_ASCEND_VERSION}${VLLM_ASCEND_A2_DIGEST} AS base-a2",
        "${VLLM_ASCEND_IMAGE}:${VLLM_ASCEND_VERSION}-a3${VLLM_ASCEND_A3_DIGEST} AS base-a3",
        "base-${ASCEND_TARGET}",
    ]
    # Digest pins are optional and empty by default: the tag alone is the default pin.
    assert args["VLLM_ASCEND_A2_DIGEST"] == "" and args["VLLM_ASCEND_A3_DIGEST"] == ""


@pytest.mark.parametrize("name", DOCKERFILES)
def test_image_runs_non_root_under_tini_with_a_healthcheck(name: str) -> None:
    stage = final_stage(dockerfile_instructions(DOCKERFILES[name]))
    users = [i.args for i in stage if i.name == "USER"]
    assert users and users[-1] not in ("root", "0", "0:0"), "the server must not run as root"
    assert re.fullmatch(r"\$\{APP_UID\}:\$\{\w+_GID\}", users[-1]), "numeric user (Kubernetes runAsNonRoot)"
    assert any("tini" in i.args for i in stage if i.name == "RUN"), "tini is installed"
    command = image_command(DOCKERFILES[name])
    assert command[:2] == ["/usr/bin/tini", "--"], "tini is PID 1 (reaps children, forwards signals)"
    assert command[-1].endswith("/entrypoint.py") and command[-2] in ("python", "python3")
    health = [exec_form(i) for i in stage if i.name == "HEALTHCHECK"]
    assert health and health[-1][-2:] == [f"{APP_DIR}/healthcheck/probe.py", "live"]
    options = next(i.args for i in stage if i.name == "HEALTHCHECK")
    assert re.search(r"--start-period=\d+m", options), "a cold start needs minutes"
    env = image_env(DOCKERFILES[name])
    assert env["HOME"] == "/home/minicpmv" and env["PORT"] == "8000"
    workdir = [i.args for i in stage if i.name == "WORKDIR"][-1]
    assert workdir == env["HOME"], "CANN writes kernel_meta/ into the working directory: a writable one"


def test_ascend_entrypoint_sets_up_cann_then_execs_the_launcher() -> None:
    command = image_command(DOCKERFILES["ascend"])
    assert command == ["/usr/bin/tini", "--", f"{APP_DIR}/bin/with-cann-env.sh", "python3",
                       f"{APP_DIR}/entrypoint.py"]


@pytest.mark.parametrize("name", DOCKERFILES)
def test_every_path_the_image_calls_is_copied_from_the_repo(name: str) -> None:
    """ENTRYPOINT, HEALTHCHECK, and the paths compose and Kubernetes call, exist in the image as
    copies of these repo files (entrypoint.py, healthcheck/probe.py, ...)."""
    stage = final_stage(dockerfile_instructions(DOCKERFILES[name]))
    files = copy_map(stage)
    assert files[f"{APP_DIR}/entrypoint.py"] == REPO / "entrypoint.py"
    assert files[f"{APP_DIR}/healthcheck/probe.py"] == REPO / "healthcheck" / "probe.py"
    assert files[f"{APP_DIR}/scripts/download_weights.sh"] == REPO / "scripts" / "download_weights.sh"
    used = image_command(DOCKERFILES[name]) + [a for i in stage if i.name == "HEALTHCHECK" for a in exec_form(i)]
    for arg in used:
        if arg.startswith(APP_DIR):
            assert arg in files, f"{arg} is called but not copied into the image"
    # Executable in the repo too, so they run the same way from a checkout (COPY --chmod sets the
    # mode in the image regardless).
    for image_path, src in files.items():
        if not image_path.startswith(f"{APP_DIR}/build/"):  # data, not programs
            assert os.access(src, os.X_OK), f"{src} is not executable"


def test_ascend_image_installs_this_project_and_the_decided_transformers() -> None:
    """decide (keep the base's transformers, or the pin) -> pip install its requirement file and
    this project -> verify -> import the model's config class -> the plugin is registered; the
    table is copied next to the decision's record (scripts/ascend_check.py reads both)."""
    stage = final_stage(dockerfile_instructions(DOCKERFILES["ascend"]))
    install = next(i for i in stage if i.name == "RUN" and "pip install" in i.args)
    assert install.args.startswith("--mount=type=bind,source=.,target=/tmp/src")
    commands = [argv for _, argv in shell_commands(expand(run_script(install), stage_args(dockerfile_instructions(
        DOCKERFILES["ascend"]))))]
    record = f"{APP_DIR}/build/transformers-decision.json"
    requirement = f"{APP_DIR}/build/transformers-requirement.txt"
    assert commands[0][:5] == ["python3", "/tmp/src/scripts/transformers_decision.py", "decide", "--pin", ""]
    assert commands[0][commands[0].index("--target") + 1] == TARGETS_TABLE["default"]
    assert commands[0][commands[0].index("--record") + 1] == record
    assert commands[0][commands[0].index("--requirement-file") + 1] == requirement
    # pip downloads: through the CA wrapper (the build secret `build_ca`, when the site gives one).
    assert commands[1][:4] == ["/tmp/src/deploy/docker/with-build-ca.sh", "python3", "-m", "pip"]
    assert commands[1][-3:] == ["-r", requirement, "/tmp/src"]
    assert "--mount=type=secret,id=build_ca" in install.args
    assert commands[2] == ["python3", "/tmp/src/scripts/transformers_decision.py", "verify", "--record", record]
    assert commands[3] == ["python3", "/tmp/src/scripts/transformers_decision.py", "import", "--record", record]
    assert "vllm.general_plugins" in commands[4][2]
    files = copy_map(stage)
    assert files[f"{APP_DIR}/build/ascend-targets.yaml"] == REPO / "deploy" / "ascend-targets.yaml"


def test_cpu_image_installs_the_lock_and_the_torchvision_shim_like_the_makefile() -> None:
    stage = final_stage(dockerfile_instructions(DOCKERFILES["cpu"]))
    run = " ".join(i.args for i in stage if i.name == "RUN")
    assert "--no-deps" in run and "-r /tmp/cpu.lock" in run and "source=requirements/cpu.lock" in run
    assert '--extra-index-url "${TORCH_INDEX_URL}"' in run, "torch +cpu comes from PyTorch's CPU index"
    assert "scripts/torchvision_cpu_shim.py" in run
    args = build_args(dockerfile_instructions(DOCKERFILES["cpu"]))
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert args["PYTHON_IMAGE"].startswith("python:3.11-slim"), "the lock is for Python 3.11"


def test_dockerignore_keeps_venvs_weights_and_git_out_of_the_context() -> None:
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", ".venv-*", "models"} <= ignored
    for needed in ("entrypoint.py", "healthcheck", "src", "pyproject.toml", "README.md", "scripts",
                   "deploy", "requirements"):
        assert needed not in ignored, f"{needed} is needed by the build"


# --------------------------------------------------------------------------------------------
# The CANN exec wrapper, against a fake CANN installation
# --------------------------------------------------------------------------------------------

REPORT = textwrap.dedent("""\
    import json, os, sys
    keys = ("FAKE_TOOLKIT", "TOOLKIT_ARGC", "FAKE_IR", "ATB_ARGS", "LD_PRELOAD", "LD_LIBRARY_PATH")
    print(json.dumps({"pid": os.getpid(), "argv": sys.argv[1:], "env": {k: os.environ.get(k) for k in keys}}))
""")


@pytest.fixture
def fake_cann(tmp_path: pathlib.Path) -> pathlib.Path:
    return cann_tree(tmp_path / "Ascend")


def run_wrapper(root: pathlib.Path, *command: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen([str(WRAPPER), *command], env=clean_env(MINICPMV_ASCEND_ROOT=str(root), **env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_wrapper_sources_cann_then_execs_the_command_in_its_own_process(fake_cann: pathlib.Path) -> None:
    process = run_wrapper(fake_cann, sys.executable, "-c", REPORT, "--port", "8000", "--cxx_abi=0")
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    report = json.loads(out)
    assert report["pid"] == process.pid, "exec: the command replaced the wrapper's shell"
    assert report["argv"] == ["--port", "8000", "--cxx_abi=0"], "arguments reach the command unchanged"
    env = report["env"]
    assert env["FAKE_TOOLKIT"] == "1" and env["FAKE_IR"] == "1"
    assert env["TOOLKIT_ARGC"] == "0", "set_env.sh must not see the command's arguments as its own"
    assert env["ATB_ARGS"] == "--cxx_abi=1", "NNAL gets the ABI flag the base image passes"
    assert env["LD_LIBRARY_PATH"].split(":")[-1] == "/usr/local/lib"


def test_wrapper_fails_clearly_without_cann(tmp_path: pathlib.Path) -> None:
    process = run_wrapper(tmp_path / "nowhere", sys.executable, "-c", "print('started')")
    out, err = process.communicate(timeout=30)
    assert process.returncode == 1 and "started" not in out
    assert "ascend-toolkit/set_env.sh not found" in err and "vllm-ascend" in err


@pytest.mark.slow
def test_ascend_image_command_outside_docker_dry_run(fake_cann: pathlib.Path, tiny_config) -> None:
    """The Ascend image's ENTRYPOINT (tini dropped, paths mapped to the repo) with env/ascend.env
    and a fake CANN: the wrapper hands over to the launcher, which validates every value of the env
    file, including with vLLM's own argument parser, and prints the vLLM command it would exec."""
    files = copy_map(final_stage(dockerfile_instructions(DOCKERFILES["ascend"])))
    argv = to_host(image_command(DOCKERFILES["ascend"]), files)
    env = env_mapping(ASCEND_ENV)
    env["MODEL_PATH"] = str(tiny_config)  # the directory the compose volume would provide
    result = subprocess.run([*argv, "--dry-run"], env=clean_env(MINICPMV_ASCEND_ROOT=str(fake_cann), **env),
                            capture_output=True, text=True, timeout=180, cwd=REPO)
    assert result.returncode == 0, result.stderr + result.stdout
    command = shlex.split(result.stdout.split("command:\n", 1)[1].strip())
    assert command[1:4] == ["-m", "minicpmv_ascend.vllm_cli", "serve"]
    overrides = json.loads(command[command.index("--hf-overrides") + 1])
    assert overrides["text_config"]["rope_parameters"]["mrope_section"] == [11, 11, 10]
    assert "--enforce-eager" in command and "--no-enable-prefix-caching" in command


@pytest.mark.slow
def test_ascend_image_without_the_npu_driver_dry_run_says_what_to_mount(fake_cann, tiny_config, tmp_path) -> None:
    """The same command where torch_npu cannot load (no driver mounted: the stand-in raises what
    the real one raises): exit 2 with the launcher's message naming the driver mounts, not torch's
    traceback from inside vLLM's import."""
    site = tmp_path / "site"
    npu_without_driver(site)
    files = copy_map(final_stage(dockerfile_instructions(DOCKERFILES["ascend"])))
    argv = to_host(image_command(DOCKERFILES["ascend"]), files)
    env = {**env_mapping(ASCEND_ENV), "MODEL_PATH": str(tiny_config)}
    result = subprocess.run([*argv, "--dry-run"], capture_output=True, text=True, timeout=180, cwd=REPO,
                            env=clean_env(MINICPMV_ASCEND_ROOT=str(fake_cann), PYTHONPATH=str(site), **env))
    assert result.returncode == 2, result.stderr + result.stdout
    assert result.stderr.startswith("minicpmv-ascend: configuration error in `NPU driver`"), result.stderr
    assert HAL_ERROR in result.stderr and "/usr/local/Ascend/driver/lib64" in result.stderr
    assert "Traceback" not in result.stderr


def build_time_python_checks(path: pathlib.Path) -> list[str]:
    """The `python -c "..."` checks a Dockerfile's RUN instructions make (continuations joined)."""
    runs = " ".join(i.args for i in final_stage(dockerfile_instructions(path)) if i.name == "RUN")
    return re.findall(r'python3? -c "([^"]+)"', runs)


def test_cpu_image_build_checks_pass_in_the_environment_it_reproduces() -> None:
    """The CPU image is requirements/cpu.lock + this project, i.e. what `make venv` builds: its
    build-time checks (plugin registered with vLLM) run here with the test run's interpreter."""
    checks = build_time_python_checks(DOCKERFILES["cpu"])
    assert any("vllm.general_plugins" in c and "minicpmv_ascend_plugin" in c for c in checks)
    assert (REPO / "plugin" / "minicpmv_ascend_plugin").is_dir(), "the plugin package the check names"
    for code in checks:
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"{code}\n{result.stderr}"
