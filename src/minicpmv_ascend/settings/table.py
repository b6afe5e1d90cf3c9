"""The settings table: every setting declared once (the `Setting` record and SETTINGS), and the
error every layer and check raises (`ConfigError`, exit code 2, one message).

Each `Setting` carries its name (= YAML key), type (with its range), default, env var, vLLM flag,
help text and whether it is secret. Everything else is derived from this table: env parsing, YAML
merging, pass-through flag recognition, validation, the vLLM command line, the `--dry-run` listing
and the Markdown reference table.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

from minicpmv_ascend.server import media_urls, request_guard, tool_calls
from minicpmv_ascend.settings.types import (
    Count,
    DType,
    Fraction,
    Int,
    JsonObject,
    LogLevel,
    MambaDType,
    MediaHosts,
    MediaLimits,
    NonEmpty,
    Port,
    Seconds,
    Thinking,
    ToolStrictLevel,
)

CONFIG_FILE_ENV = "CONFIG_FILE"
EXIT_CONFIG_ERROR = 2
REDACTED = "<redacted>"
# The generator version is part of the name: a cached checkpoint of an older generator (without
# the tool-calling chat template) is not served for a newer one.
EMBEDDED_CHECKPOINT_NAME = "minicpmv46-tiny-random-seed0-v2"
DEFAULT_CACHE_DIR = "~/.cache/minicpmv-ascend"
REAL_MODEL_HINT = "MODEL_PATH=/path/to/MiniCPM-V-4.6-Thinking"


# How a setting reaches vLLM.
#   value       --flag VALUE (omitted when the effective value is None)
#   bool        --flag / --no-flag (vLLM's BooleanOptionalAction)
#   json        --flag '{"compact": "json"}' (omitted when empty)
#   list        --flag A B (vLLM's nargs="+"; omitted when the effective value is None)
#   positional  the MODEL argument of `vllm serve`
#   env         only through the exec'd process's environment (secrets, and what the kit's
#               in-server modules read; plus --middleware `middleware` when one is set)
#   middleware  --middleware with the access-control class the value selects (minicpmv_ascend.server.access)
#   launcher    used by the launcher itself, never by vLLM
Emit = Literal["value", "bool", "json", "list", "positional", "env", "middleware", "launcher"]
Source = Literal["default", "yaml", "env", "cli"]


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    type: Any
    default: Any
    # First sentence: the one line of meaning docs/configuration.md's table shows (settings.docs.brief,
    # at most BRIEF_MAX_CHARS); then the details, which only --describe prints. No `|` (it splits the table).
    help: str
    emit: Emit = "value"
    flag: str | None = None  # vLLM's canonical spelling; also recognised on the command line
    aliases: tuple[str, ...] = ()  # other vLLM spellings that mean this setting (e.g. -tp)
    env_name: str | None = None  # None: the name upper-cased
    secret: bool = False
    middleware: str | None = None  # emit "bool": an ASGI middleware vLLM gets (--middleware) while true;
    # emit "env": one it always gets (configured by the variable)

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
    Setting("served_model_name", NonEmpty, "auto",
            "Model name clients send in the `model` field; auto: the checkpoint's (minicpm-v-4.6-thinking "
            "for MiniCPM-V 4.6, minicpm-v-4.7 for 4.7). auto goes by config.json `model_type`.",
            flag="--served-model-name"),
    Setting("host", NonEmpty, "0.0.0.0", "Address the API server listens on.", flag="--host"),
    Setting("port", Port, 8000, "TCP port of the API server.", flag="--port"),
    Setting("dtype", DType, "bfloat16",
            "Weight and activation dtype. On CPU and Ascend only bfloat16 works: the Gated "
            "DeltaNet kernels of the text model need it.", flag="--dtype"),
    Setting("tensor_parallel_size", Count, 1,
            "Devices to shard the model over; must divide the attention head counts.",
            flag="--tensor-parallel-size", aliases=("-tp",)),
    Setting("data_parallel_size", Count, 1,
            "Engines in this one server, behind one port; for this model the kit recommends one server "
            "per NPU instead (docs/deploy-ascend.md, \"Eight cards\"). This is vLLM's data parallelism: "
            "each engine on its own tensor_parallel_size devices (the container needs data_parallel_size x "
            "tensor_parallel_size devices), vLLM balancing requests by their queues. The reason for one "
            "server per NPU: one engine's death stops every engine of the server.",
            flag="--data-parallel-size", aliases=("-dp",)),
    Setting("max_model_len", Count, 8192,
            "Longest context (prompt + output tokens) per request.", flag="--max-model-len"),
    Setting("max_num_seqs", Count, 16,
            "Most requests batched together, and the most sequences (`n`) one request may ask for (past "
            "it: 400). The launcher sets vLLM's VLLM_MAX_N_SEQUENCES (default 16384) to this unless the "
            "environment sets it, since n sequences are n batch slots and n past this fills the batch for "
            "several rounds (`n=1000`: 20-108 s of engine time for one request).",
            flag="--max-num-seqs"),
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
            "vLLM's compilation config (JSON object); Ascend decode graphs: "
            "`{\"cudagraph_mode\":\"FULL_DECODE_ONLY\"}` with enforce_eager false. Those graphs are for "
            "small models that are launch-bound in eager mode (vllm-ascend: Ascend HDK 25.5.1 or newer "
            "lifts the old limit on captured graphs). A cudagraph_mode with enforce_eager true is refused: "
            "vLLM would ignore it.",
            emit="json", flag="--compilation-config", aliases=("-cc",)),
    Setting("enable_prefix_caching", bool, False,
            "Prefix caching; experimental for hybrid (Gated DeltaNet) models on Ascend.",
            emit="bool", flag="--enable-prefix-caching"),
    Setting("reasoning_parser", NonEmpty, "auto",
            "Splits `<think>` output into the `reasoning` field; auto: `minicpmv` if this vLLM has it, else "
            "`qwen3`; none: off; or any parser name vLLM knows. The field is `message.reasoning` "
            "(`delta.reasoning` when streaming) on every supported vLLM, 0.23 included: "
            "`reasoning_content` is not served.",
            flag="--reasoning-parser"),
    Setting("default_thinking", Thinking, "auto",
            "Whether a request that does not set `chat_template_kwargs.enable_thinking` thinks; auto: the "
            "model's default. That default is on: 4.6 Thinking always thinks, 4.7 thinks unless asked not "
            "to. on or off: passed to vLLM as --default-chat-template-kwargs, so the chat template and the "
            "reasoning parser agree on it.", emit="json", flag="--default-chat-template-kwargs"),
    Setting("limit_mm_per_prompt", MediaLimits, {"image": 5, "video": 2},
            "Most images / videos per request (JSON object in env).",
            emit="json", flag="--limit-mm-per-prompt"),
    Setting("mamba_ssm_cache_dtype", MambaDType, "auto",
            "Dtype of the Gated DeltaNet recurrent state; auto: the checkpoint's "
            "text_config.mamba_ssm_dtype (float32 in the released model), else float32.",
            flag="--mamba-ssm-cache-dtype"),
    Setting("enable_auto_tool_choice", bool, True,
            "Tool calling (OpenAI `tools` with `tool_choice` auto, required, a named function or none), "
            "with the kit's tool-call guard (docs/applications.md). The guard: a call cut by max_tokens or "
            "missing a required argument is not handed out as a call.",
            emit="bool", flag="--enable-auto-tool-choice", middleware=tool_calls.MIDDLEWARE),
    Setting("tool_call_parser", NonEmpty, "qwen3_coder",
            "Tool-call format (MiniCPM-V 4.6 writes Qwen3-Coder XML); used only with "
            "enable_auto_tool_choice. Checked against the installed vLLM's parsers.", flag="--tool-call-parser"),
    Setting("tool_strict_level", ToolStrictLevel, "parameter",
            "How far forced and automatic tool calls are constrained: parameter (arguments follow the "
            "schema), function (call shape only), auto (vLLM's default). Under parameter the schema is the "
            "tool's JSON schema, for the call and its arguments, required fields included; auto leaves "
            "arguments free unless the tool says `strict`. vLLM >= 0.32 (vLLM 0.30 and 0.23 constrain "
            "forced calls to the tool's schema themselves).",
            flag="--tool-strict-level"),
    Setting("hf_overrides", JsonObject, {},
            "Overrides merged into the checkpoint's config.json (JSON object), e.g. the Ascend "
            "M-RoPE fix.", emit="json", flag="--hf-overrides"),
    Setting("uvicorn_log_level", LogLevel, "info", "Log level of the HTTP server.",
            flag="--uvicorn-log-level"),
    # 30 s: enough for a typical answer (a few hundred tokens) to finish, short enough for a
    # rolling update; the deploy files give the orchestrator a longer grace period than this.
    Setting("shutdown_timeout", Seconds, 30,
            "Seconds in-flight requests may still run after SIGTERM; keep it below the orchestrator's "
            "grace period. That period: Kubernetes terminationGracePeriodSeconds, compose "
            "stop_grace_period. When the seconds are up, vLLM aborts the requests still running (0, "
            "vLLM's default: at once): they get an error, and the server exits 0 a few seconds later (the "
            "plugin's shutdown-cut-requests fix; docs/reliability.md).",
            flag="--shutdown-timeout"),
    Setting("allowed_media_domains", MediaHosts, [],
            "Which http(s) image URLs the server fetches: empty none, `public` (recommended), listed "
            "hosts, `*` any (docs/reliability.md, Media fetching). Empty: clients send images inline as "
            "data: URLs. `public`, the way to turn URLs on: any host whose addresses are all "
            "public; loopback, private, link-local, multicast, reserved and cloud metadata addresses are "
            "refused, for the first URL and every redirect, and the connection goes to the checked "
            "address. Host names (exact, as in the URL, e.g. `images.example.com,10.0.0.7`): only those "
            "(vLLM's allow-list; redirects not followed); `public,images.internal` adds listed private "
            "hosts to public mode. `*`: any host, internal ones included (vLLM's own default, not "
            "recommended).",
            emit="list", flag="--allowed-media-domains"),
    Setting("media_url_fetches", Count, media_urls.DEFAULT_FETCHES,
            "Most media URL fetches in flight, server-wide, in public mode; past it: 400. They run on the "
            "plugin's own threads; a request needing one more is refused at once, and the 400 says so. Each "
            "fetch has ONE deadline for all its steps and hops (VLLM_IMAGE_FETCH_TIMEOUT 5 s, VLLM_VIDEO_FETCH_TIMEOUT "
            "30 s), so a slow host holds a slot for at most that. 32: honest fetches take 0.1-0.5 s, so "
            "32 slots carry more than the engine encodes, at most 32 x 20 MiB of bodies in memory, and "
            "asyncio's and vLLM's own thread pools stay free (docs/reliability.md, Media fetching).",
            emit="env", env_name=media_urls.FETCHES_ENV),
    Setting("max_image_aspect_ratio", Count, 200,
            "Longest side / shortest side an image may have; past it: 400, before the processor slices the "
            "image. The plugin's image-shape-400 (no vLLM setting bounds it): a 100000x1 PNG, a few hundred "
            "bytes, cost 13-53 s of processing. 200: Qwen2-VL's processor bound; long screenshots and "
            "panoramas stay far below. The pixel count is vLLM's VLLM_MAX_IMAGE_PIXELS (178956970), "
            "which the same check applies on vLLM 0.23 too.",
            emit="env", env_name="MAX_IMAGE_ASPECT_RATIO"),
    Setting("allowed_local_media_path", str, "",
            "Server directory whose files clients may send as file:// image and video URLs; empty: "
            "file:// URLs are refused. An absolute path of an existing directory, not /. Only regular files "
            "within the media download bound (VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB, else 20 MiB) are read: "
            "a larger file, a FIFO or a device is a 400 before reading.",
            flag="--allowed-local-media-path"),
    Setting("max_request_body_mb", Count, request_guard.DEFAULT_LIMIT_MB,
            "Largest request body in MiB; a larger one gets 413 before it is read (vLLM reads any size). "
            "160: five images at OpenAI's 20 MiB limit, base64-encoded, plus the request. The same "
            "layer refuses text the engine cannot encode (a lone UTF-16 surrogate such as \\ud800 in "
            "any string field) with a 400 naming the field (docs/reliability.md).",
            emit="env", env_name=request_guard.LIMIT_ENV, middleware=request_guard.MIDDLEWARE),
    Setting("media_uuids", request_guard.MediaUuids, "private",
            "private: a media `uuid` never reaches another client's media; shared: vLLM's behaviour, for a "
            "server whose only client is one trusted application. A uuid is vLLM's key for its multimodal "
            "caches, server-wide. private: a uuid beside data is dropped (the server hashes the data "
            "itself) and a uuid without data is a cache miss (400), so no client can read or replace "
            "another client's media by naming its uuid. shared: a uuid alone reuses whatever was sent "
            "under it, by anyone (docs/reliability.md, One client, another's data).",
            emit="env", env_name=request_guard.MEDIA_UUIDS_ENV),
    Setting("allow_control_tokens", bool, False,
            "Let message text contain the model's control tokens, which then act as chat-template markup; "
            "false: a 400 names the field. Control tokens are the tokenizer's special tokens: the chat "
            "template's turn markers im_start and im_end, the media placeholders; with them a user could "
            "write a system turn. true only where every client is trusted (an agent replaying its own "
            "transcripts).",
            emit="env", env_name=request_guard.CONTROL_TOKENS_ENV),
    Setting("trust_request_mm_kwargs", bool, False,
            "Accept per-request `mm_processor_kwargs` and `media_io_kwargs` from clients; false: a 400 "
            "names the field. They say how images are sliced and how many video frames are decoded. The "
            "400 comes on every vLLM target (vLLM >= 0.31 refuses them itself; 0.30 and 0.23 took them "
            "from anyone, so `{\"video\": {\"num_frames\": -1}}` lifted the frame cap). true only where "
            "every client is trusted; the parity prompts and bench cells that vary them need it.",
            emit="bool", flag="--trust-request-mm-kwargs"),
    Setting("max_media_megapixels", Count, request_guard.DEFAULT_MEGAPIXELS,
            "Most pixels one request's media may decode to, in megapixels; past it: a 400 names the part. "
            "Counted: every inline image and video/jpeg frame, sizes read from their headers before "
            "anything is decoded; also each image fetched by URL or file:// (vLLM's VLLM_MAX_IMAGE_PIXELS, "
            "set to the same unless set). 128 (384 MiB as RGB): five 25-megapixel photos, 32 frames of "
            "2560x1440; the model reads each image as a few 448x448 slices, so more pixels only cost "
            "memory (docs/reliability.md, Hostile clients).",
            emit="env", env_name=request_guard.PIXELS_ENV),
    Setting("api_key", str, "",
            "API key clients must send as `Authorization: Bearer ...`; reaches vLLM only "
            "through its environment, never its command line or logs.",
            emit="env", flag="--api-key", env_name="VLLM_API_KEY", secret=True),
    Setting("api_key_file", str, "",
            "File holding the API key (e.g. a mounted Kubernetes secret); surrounding whitespace "
            "is stripped. Use instead of api_key.", emit="env"),
    Setting("enable_admin_routes", bool, False,
            "Serve vLLM's admin and scaling routes, with the API key; false: they answer 403 naming this "
            "setting. The routes: /scale_elastic_ep, /load, /kv_event_sources; the dev-mode, profiler and "
            "runtime-LoRA routes when vLLM has them on. The key guards every other route too, except "
            "/health, /ping and /metrics (docs/reliability.md).",
            emit="middleware"),
    Setting("cache_dir", str, "",
            f"Where the embedded tiny checkpoint is generated (empty: {DEFAULT_CACHE_DIR}).",
            emit="launcher", env_name="MINICPMV_CACHE_DIR"),
)


SETTINGS_BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


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


def error(setting: Setting, value: Value, why: str, fix: str) -> ConfigError:
    return ConfigError(setting.name, setting.display(value.value) or '""', value.origin, why, fix)


def fix_where(setting: Setting, value: Value) -> str:
    """Where the operator should change the value: the layer it came from."""
    if value.source == "env":
        return f"env {setting.env}"
    if value.source == "yaml":
        return f"`{setting.name}` in the {value.origin.removeprefix('yaml ')}"
    if value.source == "cli":
        return f"the command-line flag {value.origin.removeprefix('cli flag ')}"
    return setting.where_to_set()
