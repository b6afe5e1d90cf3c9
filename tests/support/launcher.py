"""Helpers for the settings and launcher tests (no fixtures here: tests/conftest.py owns those)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

from minicpmv_ascend.settings import CONFIG_FILE_ENV, SETTINGS
from support import REPO

ENTRYPOINT = REPO / "entrypoint.py"
SECRET = "sk-test-5f0c1d2e-never-print-me"

# Variables that change what the launcher resolves: removed so the caller's shell cannot leak in.
_PROJECT_ENV = {s.env for s in SETTINGS} | {
    CONFIG_FILE_ENV, "VLLM_USE_MODELSCOPE", "HF_HUB_OFFLINE", "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_CPU_OMP_THREADS_BIND", "ASCEND_RT_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES",
}


def launcher_env(**overrides: str) -> dict[str, str]:
    """The test process's environment without the project's settings, plus `overrides`."""
    env = {k: v for k, v in os.environ.items() if k not in _PROJECT_ENV}
    env.update(overrides)
    return env


def run_entrypoint(*args: str, env: dict[str, str], timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    """Run entrypoint.py as the container does; returns the result and its wall time."""
    started = time.monotonic()
    result = subprocess.run([sys.executable, str(ENTRYPOINT), *args], env=env, cwd=REPO, check=False,
                            capture_output=True, text=True, timeout=timeout)
    return result, time.monotonic() - started


def copy_checkpoint(source: pathlib.Path, target: pathlib.Path) -> pathlib.Path:
    """A private copy a test may damage without touching the session's checkpoint."""
    shutil.copytree(source, target)
    return target


def edit_config(model_dir: pathlib.Path, **text_config: object) -> None:
    """Change text_config keys of a checkpoint copy (None deletes the key)."""
    path = model_dir / "config.json"
    config = json.loads(path.read_text())
    for key, value in text_config.items():
        if value is None:
            config["text_config"].pop(key, None)
        else:
            config["text_config"][key] = value
    path.write_text(json.dumps(config))
