"""Shell scripts (ShellCheck, every one in the repo plus the shell inside the Kubernetes Job), the
weights download script driven by a stand-in `modelscope` CLI (no network here), and the model
directory check."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from support.deploy import DOWNLOAD, FAKE_MODELSCOPE, K8S, VERIFY, lint_tool, run_tool
from support.server import REPO, clean_env


def shell_scripts() -> list[pathlib.Path]:
    """Files named *.sh or starting with a sh/bash shebang, among the repo's files (git's view:
    tracked plus untracked-but-not-ignored, so virtualenvs and caches are left out)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    found = []
    for name in filter(None, listed):
        path = REPO / name
        if not path.is_file():
            continue
        with path.open("rb") as f:
            first = f.readline(128)
        interpreter = first[2:].split()[-1:] if first.startswith(b"#!") else []
        if path.suffix == ".sh" or (interpreter and interpreter[0].rsplit(b"/", 1)[-1] in (b"sh", b"bash")):
            found.append(path)
    return sorted(found)


def test_shellcheck_every_shell_script() -> None:
    scripts = shell_scripts()
    names = {p.relative_to(REPO).as_posix() for p in scripts}
    assert {"scripts/download_weights.sh", "deploy/docker/with-cann-env.sh"} <= names
    result = run_tool(lint_tool("shellcheck"), "--format=gcc", *map(str, scripts))
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_the_smoke_jobs_shell() -> None:
    job = yaml.safe_load((K8S / "base" / "smoke.yaml").read_text())
    command = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    result = run_tool(lint_tool("shellcheck"), "--shell=sh", "--format=gcc", "-", input=command[2])
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_catches_a_mistake(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/bash\nrm -rf $1/*\n")
    result = run_tool(lint_tool("shellcheck"), str(bad))
    assert result.returncode != 0 and "SC2086" in result.stdout


# --------------------------------------------------------------------------------------------
# scripts/download_weights.sh with a stand-in `modelscope`
# --------------------------------------------------------------------------------------------



@pytest.fixture
def fake_modelscope(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "bin" / "modelscope"
    path.parent.mkdir()
    path.write_text(FAKE_MODELSCOPE.format(python=sys.executable))
    path.chmod(0o755)
    return path


def run_download(fake: pathlib.Path, checkpoint: pathlib.Path, model_dir: pathlib.Path, **env: str):
    environment = clean_env(
        PATH=f"{fake.parent}{os.pathsep}{os.environ['PATH']}", PYTHON=sys.executable,
        FAKE_MODELSCOPE_LOG=str(fake.parent / "args.json"), FAKE_MODELSCOPE_SOURCE=str(checkpoint), **env)
    return subprocess.run([str(DOWNLOAD), str(model_dir)], env=environment, capture_output=True, text=True,
                          timeout=120, cwd=REPO)


def test_download_fetches_the_thinking_model_into_the_model_dir_and_verifies_it(
        fake_modelscope, tiny_config, tmp_path) -> None:
    result = run_download(fake_modelscope, tiny_config, tmp_path / "models")
    assert result.returncode == 0, result.stderr
    dest = tmp_path / "models" / "MiniCPM-V-4.6-Thinking"
    args = json.loads((fake_modelscope.parent / "args.json").read_text())
    assert args == ["download", "--model", "OpenBMB/MiniCPM-V-4.6-Thinking", "--local_dir", str(dest)]
    assert "100%" in result.stderr, "the CLI's progress reaches the operator"
    assert f"{dest}: complete" in result.stdout
    assert "MODEL_PATH=/models/MiniCPM-V-4.6-Thinking" in result.stdout


def test_download_passes_model_id_and_revision(fake_modelscope, tiny_config, tmp_path) -> None:
    result = run_download(fake_modelscope, tiny_config, tmp_path / "m",
                          MODEL_ID="OpenBMB/MiniCPM-V-4.6", MODEL_REVISION="v1.0")
    assert result.returncode == 0, result.stderr
    args = json.loads((fake_modelscope.parent / "args.json").read_text())
    assert args == ["download", "--model", "OpenBMB/MiniCPM-V-4.6", "--revision", "v1.0",
                    "--local_dir", str(tmp_path / "m" / "MiniCPM-V-4.6")]


# The script's table of models: `    NAMES) model_repo=REPO ;;` lines of its one `case`.
MODEL_LINE = re.compile(r"^    ([\w.|-]+)\) model_repo=(\S+) ;;$", re.M)


def test_download_names_are_the_declared_models() -> None:
    """One line per model of common/models.py: its served name and model_type, its modelscope_id;
    the default is the default model's, and the header lists the same repositories."""
    from minicpmv_ascend.common import models

    text = DOWNLOAD.read_text()
    table = {tuple(names.split("|")): repo for names, repo in MODEL_LINE.findall(text)}
    assert table == {(m.served_model_name, m.model_type): m.modelscope_id for m in models.MODELS.values()}
    default = models.MODELS[models.DEFAULT_MODEL_TYPE]
    assert f'model="${{MODEL:-{default.served_model_name}}}"' in text
    header = text.split("\nset -euo pipefail", 1)[0]
    for m in models.MODELS.values():
        assert re.search(rf"^#   {re.escape(m.served_model_name)} .*\({'default; ' if m is default else ''}"
                         rf"{m.model_type}\) +{re.escape(m.modelscope_id)}", header, re.M), m.model_type


@pytest.mark.parametrize("how", ["--model", "--model=", "MODEL", "model_type"])
def test_download_takes_the_model_by_name(fake_modelscope, tiny_config_47, tmp_path, how) -> None:
    """MiniCPM-V 4.7 by name (flag, flag=, env, model_type): its repository lands in its own
    directory and verifies complete (the kit's 4.7 checkpoint: verify_model_dir knows every model)."""
    from minicpmv_ascend.common import models

    model = models.MODELS["minicpmv4_7"]
    source = shutil.copytree(tiny_config_47, tmp_path / "source")
    env = dict(PATH=f"{fake_modelscope.parent}{os.pathsep}{os.environ['PATH']}", PYTHON=sys.executable,
               FAKE_MODELSCOPE_LOG=str(fake_modelscope.parent / "args.json"), FAKE_MODELSCOPE_SOURCE=str(source))
    argv = {"--model": ["--model", model.served_model_name], "--model=": [f"--model={model.served_model_name}"],
            "MODEL": [], "model_type": ["--model", model.model_type]}[how]
    if how == "MODEL":
        env["MODEL"] = model.served_model_name
    result = subprocess.run([str(DOWNLOAD), *argv, str(tmp_path / "models")], env=clean_env(**env),
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    dest = tmp_path / "models" / model.modelscope_id.rsplit("/", 1)[1]
    args = json.loads((fake_modelscope.parent / "args.json").read_text())
    assert args == ["download", "--model", model.modelscope_id, "--local_dir", str(dest)]
    assert f"{dest}: complete" in result.stdout and "warning" not in result.stderr
    assert f"MODEL_PATH=/models/{dest.name}" in result.stdout


def test_download_model_id_still_overrides_and_unknown_names_stop(fake_modelscope, tiny_config, tmp_path) -> None:
    result = run_download(fake_modelscope, tiny_config, tmp_path / "m", MODEL="minicpm-v-4.7",
                          MODEL_ID="OpenBMB/MiniCPM-V-4.6")
    assert result.returncode == 0, result.stderr
    assert json.loads((fake_modelscope.parent / "args.json").read_text())[2] == "OpenBMB/MiniCPM-V-4.6"
    for argv, env in ((["--model", "minicpm-v-4.5"], {}), ([], {"MODEL": "4.7"}), (["--model"], {}),
                      (["--size", "1B"], {}), (["a", "b"], {})):
        bad = subprocess.run([str(DOWNLOAD), *argv], env=clean_env(MODELSCOPE="true", **env), capture_output=True,
                             text=True, timeout=30, cwd=tmp_path)
        assert bad.returncode == 2 and "download_weights.sh" in bad.stderr + bad.stdout, (argv, env, bad.stderr)
        assert "downloading" not in bad.stdout
    assert "unknown model 'minicpm-v-4.5': minicpm-v-4.6-thinking (default) or minicpm-v-4.7" in subprocess.run(
        [str(DOWNLOAD), "--model", "minicpm-v-4.5"], env=clean_env(MODELSCOPE="true"), capture_output=True,
        text=True, timeout=30).stderr


def test_download_fails_on_an_incomplete_checkpoint(fake_modelscope, tiny_config, tmp_path) -> None:
    result = run_download(fake_modelscope, tiny_config, tmp_path / "models", FAKE_MODELSCOPE_TRUNCATE="1")
    assert result.returncode == 1
    assert "truncated" in result.stderr and "run this script again" in result.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_download_into_a_volume_it_cannot_write_says_how_to_fix_it() -> None:
    """An NFS-like volume that ignores fsGroup stays owned by its export's user: the download Job
    (UID 1000) cannot write it. The script stops with exit 2 and the fix, before downloading."""
    import tempfile

    volume = pathlib.Path(tempfile.mkdtemp(prefix="nfs-like-"))  # root's, mode 0755: as such exports are
    volume.chmod(0o755)
    try:
        # `true` as the CLI: the script must stop before it would run it.
        environment = clean_env(MODELSCOPE="true", PYTHON=sys.executable, HOME="/nonexistent")
        result = subprocess.run(["setpriv", "--reuid", "1000", "--regid", "1000", "--clear-groups",
                                 str(DOWNLOAD), str(volume)], env=environment, capture_output=True,
                                text=True, timeout=60, cwd="/")
    finally:
        shutil.rmtree(volume)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"cannot write to {volume}/MiniCPM-V-4.6-Thinking as uid 1000, gid 1000" in result.stderr
    assert "owner 0:0, mode 755" in result.stderr and "anonuid=1000" in result.stderr
    assert "downloading" not in result.stdout


def test_download_without_modelscope_says_how_to_get_it(tmp_path) -> None:
    result = subprocess.run([str(DOWNLOAD), str(tmp_path)], env=clean_env(MODELSCOPE="no-such-modelscope"),
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "pip install modelscope" in result.stderr


# --------------------------------------------------------------------------------------------
# scripts/verify_model_dir.py
# --------------------------------------------------------------------------------------------


def verify(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(VERIFY), *args], capture_output=True, text=True, timeout=60,
                          env=clean_env())


def test_verify_reports_a_complete_checkpoint_as_complete(tiny_config) -> None:
    result = verify(str(tiny_config), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["complete"] and report["problems"] == [] and report["warnings"] == []
    assert report["architectures"] == ["MiniCPMV4_6ForConditionalGeneration"]


def test_verify_reports_what_is_missing_with_the_launchers_checks(tiny_config, tmp_path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_config, broken)
    (broken / "tokenizer.json").unlink()
    result = verify(str(broken))
    # 3, not 1: Python exits 1 on any crash, which must never read as "incomplete".
    assert result.returncode == 3 and "tokenizer files are missing" in result.stderr
    from minicpmv_ascend.common import model_files  # the server's start-up check

    assert model_files.checkpoint_problems(broken) and "tokenizer" in model_files.checkpoint_problems(broken)[0]


def test_verify_warns_about_another_model(tiny_config, tmp_path) -> None:
    other = tmp_path / "other"
    shutil.copytree(tiny_config, other)
    config = json.loads((other / "config.json").read_text())
    config["architectures"] = ["Qwen3ForCausalLM"]
    (other / "config.json").write_text(json.dumps(config))
    result = verify(str(other))
    assert result.returncode == 0 and "this is no MiniCPM-V checkpoint this kit serves" in result.stderr
    assert "none of MiniCPMV4_6ForConditionalGeneration, MiniCPMV4_7ForConditionalGeneration" in result.stderr


def test_verify_accepts_every_declared_model(tiny_config_47) -> None:
    """EXPECTED_ARCHITECTURES is common/models.py's: the kit's 4.7 checkpoint verifies without a
    warning (what a 4.7 release is checked for: tests/test_minicpmv47_release.py)."""
    from minicpmv_ascend.common import models

    result = verify(str(tiny_config_47), "--json")
    assert result.returncode == 0 and result.stderr == "", result.stderr
    report = json.loads(result.stdout)
    assert report["model"] == models.MODELS["minicpmv4_7"].name and report["warnings"] == []


def test_verify_of_a_missing_directory_exits_2(tmp_path) -> None:
    assert verify(str(tmp_path / "missing")).returncode == 2
