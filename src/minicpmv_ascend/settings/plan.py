"""The plan: what runs. Effective values (auto, none and conditions resolved), the vLLM command
line, the environment vLLM gets (its defaults apply only where the operator set nothing; the API
key only there), and the redaction of secrets in what is printed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from minicpmv_ascend import vllm_source
from minicpmv_ascend.common.api_key import ApiKeyError, read_api_key
from minicpmv_ascend.common.model_files import checkpoint_problems
from minicpmv_ascend.common.models import DEFAULT_MODEL_TYPE, MODELS, Model, model_for_config, model_for_id
from minicpmv_ascend.server import access, media_urls, request_guard
from minicpmv_ascend.settings import checks
from minicpmv_ascend.settings.layers import Resolution
from minicpmv_ascend.settings.platform import (
    auto_reasoning_parser,
    detect_platform,
    embedded_checkpoint_dir,
    modelscope_enabled,
)
from minicpmv_ascend.settings.table import REDACTED, SETTINGS, SETTINGS_BY_NAME, ConfigError, Setting, error, fix_where

# vLLM has no switch that turns media URL fetching off: an empty --allowed-media-domains means
# *every* host. So "off" is an allow-list holding only this entry, which can never equal a URL's
# host (spaces and parentheses are not allowed in one). vLLM quotes it in its 400 answer, so it
# doubles as the hint: to the client (send the image inline) and to its operator (the setting).
MEDIA_FETCHING_OFF = (f"none (fetching image URLs is off: the server setting {media_urls.SETTING_HINT} "
                      "turns it on; or send the image inline as a data: URL)")
VLLM_CLI_MODULE = "minicpmv_ascend.vllm_cli"
# vLLM's automatic OpenMP binding keeps one core per worker away from the model for its API server
# and engine loop (vllm/utils/ompmultiprocessing.py: reserve_cpu_num = local_world_size, "TODO:
# make scheduler proc sleep when idle"). On a small host that core is a large share of the compute:
# on 2 cores, giving both to the model served 1.8x the tokens/s at 16 concurrent requests and 1.2x
# at one (docs/performance.md, "CPU binding"). Up to this many usable CPUs the launcher therefore
# reserves none; above it the reservation costs at most 1/N of the compute and vLLM's own choice
# stands (reasoned, not measured here: the harness command in docs/performance.md checks a host).
SMALL_CPU_HOST_MAX_CPUS = 4


@dataclasses.dataclass
class Plan:
    resolution: Resolution
    platform: str
    model: str  # what vLLM gets as MODEL
    model_dir: pathlib.Path | None  # local directory (None for a ModelScope id)
    embedded: bool  # the random-weight tiny checkpoint
    served: Model  # which MiniCPM-V (common.models), from config.json
    effective: dict[str, Any]  # value used after resolving auto / none / conditions
    vllm_args: list[str]  # everything after `vllm serve`
    api_key: str | None
    env_defaults: dict[str, str]  # set in vLLM's environment only where the operator did not
    notes: list[str]

    def command(self, python: str | None = None) -> list[str]:
        return [python or sys.executable, "-m", VLLM_CLI_MODULE, "serve", *self.vllm_args]

    def exec_env(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if environ is None else environ)
        for key, value in self.env_defaults.items():
            env.setdefault(key, value)
        env.pop("VLLM_API_KEY", None)  # an empty placeholder must not reach vLLM either
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key
        return env


def _read_api_key(resolution: Resolution) -> str | None:
    key, key_file = resolution.values["api_key"], resolution.values["api_key_file"]
    try:
        return read_api_key(key.value, key_file.value, key.origin)
    except ApiKeyError as err:
        raise ConfigError("api_key_file", key_file.value, key_file.origin, err.why, err.fix) from None


def _locate_model(resolution: Resolution, environ: Mapping[str, str]) -> tuple[str, pathlib.Path | None, bool]:
    """-> (MODEL for vLLM, local directory or None, is the embedded checkpoint)."""
    model = resolution.values["model_path"]
    setting = SETTINGS_BY_NAME["model_path"]
    if not model.value:
        path = embedded_checkpoint_dir(resolution["cache_dir"])
        return str(path), path, True
    path = pathlib.Path(os.path.expanduser(model.value))
    if path.is_dir():
        return str(path), path, False
    if modelscope_enabled(environ):
        return model.value, None, False  # a model id vLLM downloads from ModelScope
    why = "it is a file, not a directory" if path.exists() else "no such directory"
    raise error(setting, model, why,
                f"point {fix_where(setting, model)} at the checkpoint directory (e.g. "
                "/models/MiniCPM-V-4.6-Thinking), or set VLLM_USE_MODELSCOPE=true to download "
                "a model id such as OpenBMB/MiniCPM-V-4.6-Thinking")


def _served_model(model: str, config: Mapping[str, Any], hub_id: bool) -> Model:
    """The declared model of a checkpoint's config.json; for a ModelScope id (no config.json yet),
    the model whose download or family it names; else the default (4.6)."""
    declared = model_for_config(dict(config))
    if declared is None and hub_id:
        declared = model_for_id(model)[0]
    return declared or MODELS[DEFAULT_MODEL_TYPE]


def _effective(resolution: Resolution, config: Mapping[str, Any], served: Model) -> dict[str, Any]:
    """Turn auto / none / conditional settings into what vLLM is given (None = not passed)."""
    eff = {name: v.value for name, v in resolution.values.items()}
    if eff["served_model_name"] == "auto":
        eff["served_model_name"] = served.served_model_name
    # auto: the model's own default, made explicit where the model has a switch (4.7), so that its
    # chat template and the reasoning parser agree whatever the released template's default is.
    thinking = {"auto": True if served.thinking_switch else None, "on": True, "off": False}[eff["default_thinking"]]
    eff["default_thinking"] = None if thinking is None else {"enable_thinking": thinking}
    if eff["reasoning_parser"] == "auto":
        eff["reasoning_parser"] = auto_reasoning_parser()
    elif eff["reasoning_parser"].lower() == "none":
        eff["reasoning_parser"] = None
    if eff["mamba_ssm_cache_dtype"] == "auto":
        declared = (config.get("text_config") or {}).get("mamba_ssm_dtype")
        eff["mamba_ssm_cache_dtype"] = declared if declared in ("float32", "bfloat16", "float16") else "float32"
    if not eff["enable_auto_tool_choice"]:
        eff["tool_call_parser"] = None  # vLLM only uses it for automatic tool choice
    if not eff["enable_auto_tool_choice"] or not vllm_source.has_tool_strict_level():
        eff["tool_strict_level"] = None  # unused, or a vLLM without the flag (check_tool_calling)
    if not vllm_source.has_trust_request_mm_kwargs():
        eff["trust_request_mm_kwargs"] = None  # vLLM < 0.31 takes them from anyone: the request guard decides
    hosts = eff["allowed_media_domains"]
    if media_urls.PUBLIC in hosts:  # the plugin checks addresses; without it vLLM refuses every URL
        hosts = [media_urls.PUBLIC_SENTINEL, *(h for h in hosts if h != media_urls.PUBLIC)]
    eff["allowed_media_domains"] = None if hosts == ["*"] else (hosts or [MEDIA_FETCHING_OFF])
    local = eff["allowed_local_media_path"]
    # Resolved: vLLM 0.23 compares it with the resolved parents of the requested file.
    eff["allowed_local_media_path"] = str(pathlib.Path(local).resolve()) if local else None
    return eff


def setting_argv(setting: Setting, value: Any) -> list[str]:
    """The vLLM flags for one setting's effective value."""
    flag = setting.flag or ""
    if setting.emit == "bool" and value is not None:
        middleware = ["--middleware", setting.middleware] if value and setting.middleware else []
        return [flag if value else "--no-" + flag.removeprefix("--"), *middleware]
    if setting.emit == "json":
        return [flag, json.dumps(value, separators=(",", ":"))] if value else []
    if setting.emit == "list":
        return [flag, *value] if value is not None else []
    if setting.emit == "value" and value is not None:
        return [flag, str(value)]
    if setting.emit == "middleware":
        return ["--middleware", access.middleware_path(bool(value))]
    if setting.emit == "env" and setting.middleware:
        return ["--middleware", setting.middleware]
    return []  # positional, env, launcher, or not passed


def build_vllm_args(model: str, effective: Mapping[str, Any], passthrough: Sequence[str]) -> list[str]:
    args = [model]
    for setting in SETTINGS:
        args += setting_argv(setting, effective[setting.name])
    return args + list(passthrough)


def _package_pythonpath(environ: Mapping[str, str]) -> str | None:
    """From a source checkout the exec'd interpreter must find this package too."""
    root = str(pathlib.Path(__file__).resolve().parents[2])  # the directory that holds minicpmv_ascend/
    import site

    installed = {str(pathlib.Path(p).resolve()) for p in (*site.getsitepackages(), site.getusersitepackages())}
    current = environ.get("PYTHONPATH", "")
    if root in installed or root in current.split(os.pathsep):
        return None
    return os.pathsep.join(p for p in (root, current) if p)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity, as vLLM's automatic binding counts them)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# How long a reader of vLLM's message queue (engine core, worker) sleeps between checks in the 1 s
# it busy-loops after each message (the plugin's shm-busy-sleep, upstream's proposed variable): on
# a small host that loop is two runnable processes beside the ones that work (docs/performance.md,
# "The message queue's busy loop").
SHM_BUSY_SLEEP_S = "0.0002"


def cpu_env_defaults(usable_cpus: int) -> dict[str, str]:
    """vLLM-CPU's environment defaults: a 1 GiB KV cache (the rehearsal's models are small) and
    automatic OpenMP binding, with no core reserved on a small host. There the OpenMP team shares
    its cores with the API server and engine loop, so its idle threads sleep instead of spinning
    (OMP_WAIT_POLICY=PASSIVE; docs/performance.md "CPU binding": a spinning team took 3x the
    CPU-seconds and 2.5x the time for the same requests beside one busy process), and so do the
    message queue's readers between their checks."""
    defaults = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "auto"}
    if usable_cpus <= SMALL_CPU_HOST_MAX_CPUS:
        defaults |= {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "OMP_WAIT_POLICY": "PASSIVE",
                     "MINICPMV_ASCEND_PLUGIN_SHM_BUSY_SLEEP_S": SHM_BUSY_SLEEP_S}
    return defaults


def build_plan(resolution: Resolution, environ: Mapping[str, str] | None = None,
               platform: str | None = None, dev_dir: str | os.PathLike[str] = "/dev") -> Plan:
    """All checks that need no vLLM import; raises ConfigError. Reads the checkpoint's metadata."""
    environ = os.environ if environ is None else environ
    platform = platform or detect_platform()
    notes: list[str] = []
    api_key = _read_api_key(resolution)
    model, model_dir, embedded = _locate_model(resolution, environ)
    config: dict[str, Any] = {}
    if model_dir is not None and model_dir.is_dir():
        problems = checkpoint_problems(model_dir)
        if problems:
            setting, value = SETTINGS_BY_NAME["model_path"], resolution.values["model_path"]
            raise error(setting, value, f"incomplete checkpoint in {model_dir}: {'; '.join(problems)}",
                        "finish or repeat the download (all files of the model repository), or "
                        f"point {fix_where(setting, value)} at a complete checkpoint")
        config = checks.read_checkpoint_config(model_dir, resolution.values["model_path"])
        checks.check_checkpoint(resolution, model_dir, config)
    elif embedded:
        notes.append(f"the embedded checkpoint {model_dir} is not generated yet: a real start "
                     "generates it (checks against its config.json run then)")
    else:
        notes.append(f"{model} is a ModelScope model id: vLLM downloads it (checkpoint checks skipped)")
    served = _served_model(model, config, model_dir is None)
    if config:  # a checkpoint directory's: its model must be in this vLLM
        checks.check_model_in_vllm(resolution, served)
        checks.check_text_tower(resolution, served, config)
        checks.check_release_shape(resolution, model_dir, config, served, notes)
    elif model_dir is None:  # a hub id: what its name says, before vLLM downloads it
        checks.check_hub_id(resolution, model, notes)
    checks.check_devices(resolution, platform, environ, dev_dir)
    if platform == "ascend":
        checks.check_device_access(environ, notes, dev_dir)
    checks.check_platform(resolution, platform)
    checks.check_compilation_config(resolution)
    checks.check_local_media(resolution)
    effective = _effective(resolution, config, served)
    if not embedded:  # the embedded checkpoint writes the canvas field itself
        effective["hf_overrides"] = checks.canvas_overrides(
            resolution, served, config if model_dir is not None else None, notes)
    checks.check_tool_calling(resolution, effective)
    # vLLM checks only the first URL's host against allowed_media_domains; a redirect from an
    # allowed host could lead anywhere (an internal address, SSRF). In public mode every hop is
    # checked (media_urls), so redirects are followed there.
    public = media_urls.PUBLIC in resolution["allowed_media_domains"]
    env_defaults: dict[str, str] = {"VLLM_MEDIA_URL_ALLOW_REDIRECTS": "1" if public else "0",
                                    media_urls.FETCHES_ENV: str(resolution["media_url_fetches"]),
                                    request_guard.LIMIT_ENV: str(resolution["max_request_body_mb"]),
                                    request_guard.MEDIA_UUIDS_ENV: resolution["media_uuids"],
                                    request_guard.CONTROL_TOKENS_ENV: str(resolution["allow_control_tokens"]).lower(),
                                    request_guard.MM_KWARGS_ENV: str(resolution["trust_request_mm_kwargs"]).lower(),
                                    "MAX_IMAGE_ASPECT_RATIO": str(resolution["max_image_aspect_ratio"]),
                                    request_guard.PIXELS_ENV: str(resolution["max_media_megapixels"]),
                                    # the same bound for each image vLLM fetches (URL, file://)
                                    "VLLM_MAX_IMAGE_PIXELS": str(resolution["max_media_megapixels"] * 1_000_000),
                                    # n sequences take n batch slots: n past max_num_seqs only queues
                                    # work behind itself (vLLM's own cap is 16384)
                                    "VLLM_MAX_N_SEQUENCES": str(effective["max_num_seqs"])}
    if model_dir is not None:
        env_defaults["HF_HUB_OFFLINE"] = "1"  # a local directory never needs the hub
    if platform == "cpu":
        env_defaults |= cpu_env_defaults(usable_cpus())
    if (pythonpath := _package_pythonpath(environ)) is not None:
        env_defaults["PYTHONPATH"] = pythonpath
    return Plan(resolution, platform, model, model_dir, embedded, served, effective,
                build_vllm_args(model, effective, resolution.passthrough), api_key, env_defaults, notes)


# Pass-through flags whose values must never be printed (vLLM's --api-key, --hf-token, ...).
# `api-key` anywhere (also in typos such as --api-keyy); the others only at the end of the name,
# so that --max-num-batched-tokens or --ssl-keyfile stay visible.
_SECRET_FLAG = re.compile(r"^--?([\w.-]*api[-_]?key[\w.-]*|[\w.-]*(key|token|secret|password))$", re.IGNORECASE)


def redact_args(args: Sequence[str]) -> list[str]:
    """The command line with the values of secret-looking flags replaced by <redacted>."""
    out = list(args)
    for i, arg in enumerate(out):
        name, has_value, _ = arg.partition("=")
        if not _SECRET_FLAG.match(name):
            continue
        if has_value:
            out[i] = f"{name}={REDACTED}"
        elif i + 1 < len(out) and not out[i + 1].startswith("-"):
            out[i + 1] = REDACTED
    return out


def redact_text(text: str, args: Sequence[str]) -> str:
    """Remove from a message every value `redact_args` would hide in `args`."""
    for original, shown in zip(args, redact_args(args)):
        if original != shown:
            secret = original.partition("=")[2] if "=" in shown else original
            if secret:
                text = text.replace(secret, REDACTED)
    return text
