"""entrypoint.py through real subprocesses: dry run, help, and the embedded checkpoint's atomic
generation. (Bad settings failing fast with exit code 2: tests/test_bad_config.py. Starting vLLM
for real is the end-to-end tests' job.)"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from minicpmv_ascend import settings
from minicpmv_ascend.common import model_files
from minicpmv_ascend.settings import SETTINGS
from support.launcher import SECRET, launcher_env, run_entrypoint

VLLM_PARSER_FAIL_S = 90  # hang guard for errors found by vLLM's parser (imports vLLM: ~8-15 s)


def _command_from(output: str) -> list[str]:
    lines = output.splitlines()
    return shlex.split(lines[lines.index("command:") + 1])


@pytest.mark.slow
def test_dry_run_shows_values_sources_and_the_command(tiny_config, tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text("seed: 7\nport: 9000\n")
    env = launcher_env(MODEL_PATH=str(tiny_config), PORT="18199", VLLM_API_KEY=SECRET)
    env.pop("PYTHONPATH", None)  # the shim must find the package from a source checkout by itself
    result, _ = run_entrypoint("--config", str(config), "--dry-run", "--max-model-len", "4096",
                               "--disable-log-stats", env=env)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "dry run: nothing is started" in out
    rows = {line.split("=")[0].strip(): line for line in out.splitlines() if line.startswith("  ") and " = " in line}
    assert set(rows) >= {s.name for s in SETTINGS}
    assert rows["port"].endswith("= 18199  [env PORT]")  # env beats YAML
    assert rows["seed"].endswith(f"= 7  [yaml file {config}]")
    assert rows["max_model_len"].endswith("= 4096  [cli flag --max-model-len]")
    assert rows["served_model_name"].endswith("= auto -> minicpm-v-4.6-thinking  [default]")  # the model's name
    assert rows["api_key"].endswith(f"= {settings.REDACTED}  [env VLLM_API_KEY]")
    assert SECRET not in out + result.stderr
    command = _command_from(out)
    assert command[:5] == [sys.executable, "-m", "minicpmv_ascend.vllm_cli", "serve", str(tiny_config)]
    assert command[command.index("--port") + 1] == "18199"
    assert command[command.index("--max-model-len") + 1] == "4096"
    assert command[-1] == "--disable-log-stats" and "--api-key" not in command
    assert "HF_HUB_OFFLINE=1" in out and "VLLM_CPU_KVCACHE_SPACE=1" in out


@pytest.mark.slow
def test_dry_run_of_the_default_model_warns_and_generates_nothing(tmp_path):
    env = launcher_env(MINICPMV_CACHE_DIR=str(tmp_path))
    result, _ = run_entrypoint("--dry-run", env=env)
    assert result.returncode == 0, result.stderr
    assert "RANDOM-WEIGHT" in result.stdout and settings.REAL_MODEL_HINT in result.stdout
    assert _command_from(result.stdout)[4] == str(tmp_path / settings.EMBEDDED_CHECKPOINT_NAME)
    assert list(tmp_path.iterdir()) == []  # a dry run has no side effects


def test_help_lists_every_setting():
    result, _ = run_entrypoint("--help", env=launcher_env())
    assert result.returncode == 0
    for s in SETTINGS:
        assert f"  {s.name} / {s.env}" in result.stdout


@pytest.mark.slow
def test_interrupted_generation_leaves_no_checkpoint(tmp_path):
    """Kill a generation midway: no directory under the final name; the next start completes it."""
    target = tmp_path / settings.EMBEDDED_CHECKPOINT_NAME
    code = ("import pathlib, sys; from minicpmv_ascend.launcher import ensure_embedded_checkpoint; "
            "ensure_embedded_checkpoint(pathlib.Path(sys.argv[1]))")
    process = subprocess.Popen([sys.executable, "-c", code, str(target)], env=launcher_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    # Wait until the attempt has written part of a checkpoint (the tokenizer comes first).
    while not list(tmp_path.glob(f".{target.name}.tmp-*/tokenizer.json")) and time.monotonic() < deadline:
        assert process.poll() is None, "generation ended before it could be interrupted"
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(30)
    assert not target.exists()
    assert list(tmp_path.glob(f".{target.name}.tmp-*"))  # the abandoned attempt is still there

    subprocess.run([sys.executable, "-c", code, str(target)], env=launcher_env(), check=True,
                   capture_output=True, timeout=300)
    assert model_files.checkpoint_problems(target) == []
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # the abandoned attempt is cleaned up


@pytest.mark.slow
@pytest.mark.parametrize("extra, env, imports_vllm", [
    ([], {}, False),  # env/YAML-only start: vLLM parses the command itself after the exec
    (["--disable-log-stats"], {}, True),  # a pass-through flag: checked here, redacted, exit 2
    ([], {"REASONING_PARSER": "qwen3"}, True),  # a parser name only vLLM's registry can judge
])
def test_launcher_imports_vllms_parser_only_when_it_can_find_something(tiny_config, extra, env, imports_vllm):
    """The start-up cost of vLLM's parser (~10 s) is paid only where it checks something."""
    probe = ("import sys, os; from minicpmv_ascend import launcher; "
             f"launcher.prepare({extra!r}, dict(os.environ)); "
             "print('vllm.entrypoints' in ' '.join(sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=VLLM_PARSER_FAIL_S,
                            env=launcher_env(MODEL_PATH=str(tiny_config), **env))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == str(imports_vllm)
