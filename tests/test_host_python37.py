"""The host-side tools on the Python of Ascend host OSes: Kylin V10 and EulerOS ship Python 3.7.

healthcheck/probe.py (with the package code it imports), scripts/verify_model_dir.py and
scripts/download_weights.sh run on a host before or beside the container, under that interpreter
(pyenv's 3.7 here), standard library only: the probe against the shared CPU server, the model
check against good, damaged and missing directories, the download script through a stand-in
`modelscope`. An interpreter older than 3.7 gets a usage error (exit 2), never exit 1, which the
probe's callers read as "unhealthy" and the download script once read as "incomplete, run again".
"""

from __future__ import annotations

import glob
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

from support.deploy import DOWNLOAD, FAKE_MODELSCOPE, VERIFY
from support.server import REPO, clean_env

PROBE = REPO / "healthcheck" / "probe.py"


def pyenv_python(version: str) -> str:
    """pyenv's interpreter of that minor version (the test machine has them), or one on PATH."""
    found = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")))
    path = found[-1] if found else shutil.which(f"python{version}")
    if not path:
        pytest.fail(f"python{version} is needed for this test: `pyenv install {version}` (the host "
                    "OSes this covers ship it)")
    return path


@pytest.fixture(scope="module")
def py37() -> str:
    path = pyenv_python("3.7")
    version = subprocess.run([path, "-c", "import sys; print(sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    assert version == "(3, 7)", version
    return path


def run(python: str, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    # No PYTHONPATH, no site packages of this project: what a bare host has.
    environment = clean_env(**env)
    environment.pop("PYTHONPATH", None)
    return subprocess.run([python, "-I", *args] if args[0].endswith(".py") else [python, *args],
                          capture_output=True, text=True, timeout=timeout, cwd="/", env=environment)


# --------------------------------------------------------------------------------------------
# The probe


@pytest.mark.server
@pytest.mark.parametrize("mode", ["live", "ready", "smoke"])
def test_probe_on_python37_against_the_server(py37, server, mode) -> None:
    result = run(py37, str(PROBE), mode, "--url", server.base_url, "--model", server.model, "--json",
                 timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["mode"] == mode
    names = [c["name"] for c in report["checks"]]
    assert names[0] == {"live": "health", "ready": "health", "smoke": "text"}[mode]


@pytest.mark.server
def test_probe_on_python37_reports_an_unhealthy_server_with_exit_1(py37, server) -> None:
    result = run(py37, str(PROBE), "ready", "--url", server.base_url, "--model", "no-such-model")
    assert result.returncode == 1
    assert "model 'no-such-model' is not served" in result.stderr


def test_probe_on_python37_connection_refused_and_usage(py37) -> None:
    from support.server import free_port

    refused = run(py37, str(PROBE), "live", "--url", f"http://127.0.0.1:{free_port()}/v1/")
    assert refused.returncode == 1 and "connection refused" in refused.stderr
    assert run(py37, str(PROBE), "smoke", "--max-tokens", "0").returncode == 2


def test_probe_on_python36_is_a_usage_error_not_unhealthy() -> None:
    result = run(pyenv_python("3.6"), str(PROBE), "live")
    assert result.returncode == 2, result.stderr
    assert "needs Python 3.7 or newer" in result.stderr


# --------------------------------------------------------------------------------------------
# verify_model_dir.py


def damaged_copies(checkpoint: pathlib.Path, root: pathlib.Path) -> dict[str, pathlib.Path]:
    """The ways a download goes wrong, each as its own directory."""
    out = {}

    def copy(name: str) -> pathlib.Path:
        out[name] = root / name
        shutil.copytree(checkpoint, out[name])
        return out[name]

    (copy("no-tokenizer") / "tokenizer.json").unlink()
    (copy("no-config") / "config.json").unlink()
    no_processor = copy("no-processor")
    for name in ("processor_config.json", "preprocessor_config.json"):
        (no_processor / name).unlink(missing_ok=True)
    truncated = copy("truncated")
    weights = sorted(truncated.glob("*.safetensors"))[0]
    os.truncate(weights, weights.stat().st_size // 2)
    header = copy("bad-header")
    sorted(header.glob("*.safetensors"))[0].write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}xxxxx")
    no_weights = copy("no-weights")
    for weights in no_weights.glob("*.safetensors"):
        weights.unlink()
    index = copy("missing-shard")
    (index / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    return out


def test_verify_judges_like_the_servers_start_check(tiny_config, tmp_path) -> None:
    """The script reports the server's own start-up check (common.model_files, which settings
    uses too), problem by problem, on every kind of damage, with exit code 3 for any of them."""
    from minicpmv_ascend.common import model_files

    cases = damaged_copies(tiny_config, tmp_path)
    cases["complete"] = tiny_config
    for name, directory in cases.items():
        result = run(sys.executable, str(VERIFY), str(directory), "--json")
        report = json.loads(result.stdout)
        assert report["problems"] == model_files.checkpoint_problems(directory), name
        assert result.returncode == (0 if name == "complete" else 3), (name, result.stderr)


def test_verify_on_python37_good_damaged_and_missing(py37, tiny_config, tmp_path) -> None:
    ok = run(py37, str(VERIFY), str(tiny_config))
    assert ok.returncode == 0, ok.stderr
    assert f"{tiny_config}: complete" in ok.stdout
    for name, directory in damaged_copies(tiny_config, tmp_path).items():
        result = run(py37, str(VERIFY), str(directory))
        assert result.returncode == 3, (name, result.stdout, result.stderr)
        assert f"verify_model_dir: {directory}: " in result.stderr, name
    missing = run(py37, str(VERIFY), str(tmp_path / "nothing-here"))
    assert missing.returncode == 2 and "is not a directory" in missing.stderr


def test_verify_on_python36_is_a_usage_error() -> None:
    result = run(pyenv_python("3.6"), str(VERIFY), "/")
    assert result.returncode == 2 and "needs Python 3.7 or newer" in result.stderr


def test_verify_warns_when_the_container_user_cannot_read_the_files(py37, tiny_config, tmp_path) -> None:
    """What a download under `umask 077` by root leaves: complete, but unreadable to UID 1000."""
    private = tmp_path / "private"
    shutil.copytree(tiny_config, private)
    for path in [private, *private.iterdir()]:
        path.chmod(0o700 if path.is_dir() else 0o600)
        os.chown(path, 0, 0) if os.geteuid() == 0 else None
    result = run(py37, str(VERIFY), str(private))
    assert result.returncode == 0, result.stderr
    assert "not readable by the container's user (UID 1000)" in result.stderr
    assert f"chmod -R a+rX {private}" in result.stderr
    for path in [private, *private.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    assert "not readable" not in run(py37, str(VERIFY), str(private)).stderr


def test_verify_wait_returns_once_the_download_completes(py37, tiny_config, tmp_path) -> None:
    """The server's init container: waits (saying what is missing) while the directory is absent
    or partial, and exits 0 as soon as it is complete."""
    target = tmp_path / "models" / "MiniCPM-V-4.6-Thinking"
    waiting = subprocess.Popen([py37, "-I", str(VERIFY), str(target), "--wait", "0.2"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    try:
        time.sleep(2)
        assert waiting.poll() is None, waiting.communicate()
        shutil.copytree(tiny_config, target)  # the download Job's work, at once
        out, err = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
    assert waiting.returncode == 0, err
    assert "does not exist yet" in err and "waiting for a complete checkpoint" in err
    assert f"{target}: complete" in out


# --------------------------------------------------------------------------------------------
# download_weights.sh with PYTHON=python3.7


@pytest.fixture
def modelscope(tmp_path) -> pathlib.Path:
    path = tmp_path / "bin" / "modelscope"
    path.parent.mkdir()
    path.write_text(FAKE_MODELSCOPE.format(python=sys.executable))
    path.chmod(0o755)
    return path


def download(modelscope: pathlib.Path, checkpoint: pathlib.Path, model_dir: pathlib.Path, python: str,
             **env: str) -> subprocess.CompletedProcess:
    environment = clean_env(PATH=f"{modelscope.parent}{os.pathsep}{os.environ['PATH']}", PYTHON=python,
                            FAKE_MODELSCOPE_LOG=str(modelscope.parent / "args.json"),
                            FAKE_MODELSCOPE_SOURCE=str(checkpoint), **env)
    return subprocess.run([str(DOWNLOAD), str(model_dir)], env=environment, capture_output=True,
                          text=True, timeout=120, cwd=REPO)


def test_download_with_python37_verifies_complete_and_incomplete(py37, modelscope, tiny_config,
                                                                 tmp_path) -> None:
    done = download(modelscope, tiny_config, tmp_path / "a", py37)
    assert done.returncode == 0, done.stderr
    assert f"{tmp_path / 'a' / 'MiniCPM-V-4.6-Thinking'}: complete" in done.stdout
    cut = download(modelscope, tiny_config, tmp_path / "b", py37, FAKE_MODELSCOPE_TRUNCATE="1")
    assert cut.returncode == 1, cut.stderr
    assert "truncated" in cut.stderr and "run this script again" in cut.stderr


def test_download_with_too_old_a_python_is_not_taken_for_incomplete(modelscope, tiny_config,
                                                                   tmp_path) -> None:
    """The loop the issue found: the verifier failing to run must not read as "incomplete"."""
    result = download(modelscope, tiny_config, tmp_path / "m", pyenv_python("3.6"))
    assert result.returncode == 4, result.stderr
    assert "could not verify it" in result.stderr and "run this script again" not in result.stderr


def test_download_creates_files_the_container_user_can_read_under_umask_077(py37, modelscope,
                                                                            tiny_config, tmp_path) -> None:
    environment = clean_env(PATH=f"{modelscope.parent}{os.pathsep}{os.environ['PATH']}", PYTHON=py37,
                            FAKE_MODELSCOPE_LOG=str(modelscope.parent / "args.json"),
                            FAKE_MODELSCOPE_SOURCE=str(tiny_config))
    result = subprocess.run(["bash", "-c", f'umask 077 && exec "{DOWNLOAD}" "{tmp_path / "m"}"'],
                            env=environment, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "not readable" not in result.stderr
    dest = tmp_path / "m" / "MiniCPM-V-4.6-Thinking"
    for path in [tmp_path / "m", dest, *dest.iterdir()]:
        assert path.stat().st_mode & 0o004, f"{path} is not world-readable"
