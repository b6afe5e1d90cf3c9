"""The bad-configuration cases of tests/test_bad_config.py (each given to entrypoint.py there) and the
table docs/reliability.md embeds, generated from them (`make docs`; the registry of generated
tables, scripts/doc_tables.py, keeps it in sync). Test data, not tests: it lives here so
that the table's generator does not import a test module.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable

from support.launcher import SECRET, copy_checkpoint

Setup = Callable[[pathlib.Path, pathlib.Path], tuple[list[str], dict[str, str]]]


@dataclasses.dataclass(frozen=True)
class Case:
    area: str
    what: str
    given: str  # how the docs show the input
    key: str  # the setting the message must name
    fix: str  # words the "fix:" line must contain
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    args: tuple[str, ...] = ()
    setup: Setup | None = None  # (tmp dir, checkpoint) -> (args, env) for inputs that need files
    vllm: bool = False  # judged by vLLM's own parser (imports vLLM: slower)

    def inputs(self, tmp: pathlib.Path, checkpoint: pathlib.Path) -> tuple[list[str], dict[str, str]]:
        args, env = list(self.args), {"MODEL_PATH": str(checkpoint), **self.env}
        if self.setup:
            more_args, more_env = self.setup(tmp, checkpoint)
            args, env = args + more_args, env | more_env
        return args, env


def _yaml(text: str) -> Setup:
    def setup(tmp, _):
        (tmp / "serve.yaml").write_text(text)
        return ["--config", str(tmp / "serve.yaml")], {}
    return setup


def _damaged(damage: Callable[[pathlib.Path], None]) -> Setup:
    def setup(tmp, checkpoint):
        model = copy_checkpoint(checkpoint, tmp / "model")
        damage(model)
        return [], {"MODEL_PATH": str(model)}
    return setup


def _truncate(path: pathlib.Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _key_file(text: str, **env: str) -> Setup:
    def setup(tmp, _):
        (tmp / "api-key").write_text(text)
        return [], {"API_KEY_FILE": str(tmp / "api-key"), **env}
    return setup


def _a_file(tmp: pathlib.Path) -> pathlib.Path:
    (tmp / "file").write_text("not a directory")
    return tmp / "file"


CASES: tuple[Case, ...] = (
    # ---- types and ranges
    Case("type, range", "port above 65535", "`PORT=70000`", "port", "65535", env={"PORT": "70000"}),
    Case("type, range", "port that is not a number", "`PORT=http`", "port", "integer", env={"PORT": "http"}),
    Case("type, range", "port 0 on the command line", "`--port 0`", "port", ">= 1", args=("--port", "0")),
    Case("type, range", "context length that is not a number", "`MAX_MODEL_LEN=lots`", "max_model_len",
         "integer", env={"MAX_MODEL_LEN": "lots"}),
    Case("type, range", "zero concurrent sequences", "`MAX_NUM_SEQS=0`", "max_num_seqs", ">= 1",
         env={"MAX_NUM_SEQS": "0"}),
    Case("type, range", "a boolean where a count belongs (YAML)", "YAML `max_num_seqs: yes`", "max_num_seqs",
         "integer", setup=_yaml("max_num_seqs: yes\n")),
    Case("type, range", "memory fraction above 1", "`GPU_MEMORY_UTILIZATION=1.5`", "gpu_memory_utilization",
         "<= 1", env={"GPU_MEMORY_UTILIZATION": "1.5"}),
    Case("type, range", "boolean that is not one", "`ENFORCE_EAGER=maybe`", "enforce_eager", "boolean",
         env={"ENFORCE_EAGER": "maybe"}),
    Case("type, range", "image limit that is broken JSON", "`LIMIT_MM_PER_PROMPT={\"image\": 5,`",
         "limit_mm_per_prompt", "LIMIT_MM_PER_PROMPT", env={"LIMIT_MM_PER_PROMPT": '{"image": 5,'}),
    Case("type, range", "limit for a modality the model lacks", "`LIMIT_MM_PER_PROMPT={\"audio\":1}`",
         "limit_mm_per_prompt", "image, video", env={"LIMIT_MM_PER_PROMPT": '{"audio":1}'}),
    Case("type, range", "unknown log level", "`UVICORN_LOG_LEVEL=verbose`", "uvicorn_log_level", "debug",
         env={"UVICORN_LOG_LEVEL": "verbose"}),
    Case("type, range", "negative shutdown grace period", "`SHUTDOWN_TIMEOUT=-5`", "shutdown_timeout", ">= 0",
         env={"SHUTDOWN_TIMEOUT": "-5"}),
    Case("type, range", "unknown dtype", "`DTYPE=fp8`", "dtype", "bfloat16", env={"DTYPE": "fp8"}),
    # ---- the model and the devices
    Case("model, devices", "dtype the platform cannot run (float16 on CPU/Ascend)", "`DTYPE=float16`",
         "dtype", "bfloat16", env={"DTYPE": "float16"}),
    Case("model, devices", "tensor parallel size that does not divide the heads", "`TENSOR_PARALLEL_SIZE=3`",
         "tensor_parallel_size", "[1, 2]", env={"TENSOR_PARALLEL_SIZE": "3"}),
    Case("model, devices", "more tensor-parallel ranks than devices", "`-tp 2` (CPU: 1 device)",
         "tensor_parallel_size", "1 or less", args=("-tp", "2")),
    Case("model, devices", "context longer than the model's", "`--max-model-len 1000000`", "max_model_len",
         "262144 or less", args=("--max-model-len", "1000000")),
    Case("model, devices", "model directory that does not exist", "`MODEL_PATH=/absent`", "model_path",
         "VLLM_USE_MODELSCOPE", env={"MODEL_PATH": "/absent/MiniCPM-V-4.6-Thinking"}),
    Case("model, devices", "model path that is a file", "`MODEL_PATH=<a file>`", "model_path",
         "checkpoint directory", setup=lambda t, _: ([], {"MODEL_PATH": str(_a_file(t))})),
    Case("model, devices", "checkpoint without its tokenizer", "tokenizer.json deleted", "model_path",
         "download", setup=_damaged(lambda m: (m / "tokenizer.json").unlink())),
    Case("model, devices", "checkpoint with truncated weights", "model.safetensors cut in half", "model_path",
         "download", setup=_damaged(lambda m: _truncate(m / "model.safetensors"))),
    Case("model, devices", "checkpoint whose config.json is damaged", "config.json = `{not json`",
         "model_path", "re-download", setup=_damaged(lambda m: (m / "config.json").write_text("{not json"))),
    Case("model, devices", "cache directory that cannot be written (embedded model)",
         "`MINICPMV_CACHE_DIR=<under a file>`", "cache_dir", "writable directory",
         setup=lambda t, _: ([], {"MODEL_PATH": "", "MINICPMV_CACHE_DIR": str(_a_file(t) / "cache")})),
    # ---- the YAML file
    Case("YAML file", "unreadable YAML (syntax error)", "`port: [1`", "config_file", "YAML syntax",
         setup=_yaml("port: [1\n")),
    Case("YAML file", "YAML that is a list, not a mapping", "`- port: 1`", "config_file", "key: value",
         setup=_yaml("- port: 1\n")),
    Case("YAML file", "unknown key (typo)", "`max_num_seq: 4`", "max_num_seq", "did you mean `max_num_seqs`?",
         setup=_yaml("max_num_seq: 4\n")),
    Case("YAML file", "config file that does not exist", "`CONFIG_FILE=/absent.yaml`", "config_file",
         "readable YAML file", env={"CONFIG_FILE": "/absent/serve.yaml"}),
    Case("YAML file", "--config without a file name", "`--config`", "config_file", "--config /path",
         args=("--config",)),
    # ---- flags
    Case("flags", "a setting's flag given twice", "`--max-model-len 4096 --max-model-len 2048`",
         "max_model_len", "keep one", args=("--max-model-len", "4096", "--max-model-len", "2048")),
    Case("flags", "conflicting boolean flags", "`--enforce-eager --no-enforce-eager`", "enforce_eager",
         "keep one", args=("--enforce-eager", "--no-enforce-eager")),
    Case("flags", "abbreviated flag vLLM would apply unseen", "`--max-model 4096`", "max_model_len",
         "write the whole flag", args=("--max-model", "4096")),
    Case("flags", "misspelt vLLM flags (one carrying a secret)", "`--max-num-seqz 4 --api-keyy <key>`",
         "command line", "remove or correct the flag", args=("--max-num-seqz", "4", "--api-keyy", SECRET),
         vllm=True),
    Case("flags", "automatic tool choice without a usable tool parser",
         "`ENABLE_AUTO_TOOL_CHOICE=true TOOL_CALL_PARSER=none`", "tool_call_parser", "qwen3_coder",
         env={"ENABLE_AUTO_TOOL_CHOICE": "true", "TOOL_CALL_PARSER": "none"}, vllm=True),
    Case("flags", "reasoning parser vLLM does not have", "`REASONING_PARSER=minicpm`", "reasoning_parser",
         "did you mean 'minicpmv'", env={"REASONING_PARSER": "minicpm"}, vllm=True),
    # ---- the API key
    Case("API key", "API key file that does not exist", "`API_KEY_FILE=/absent`", "api_key_file",
         "mount the secret", env={"API_KEY_FILE": "/absent/api-key"}),
    Case("API key", "empty API key file", "`API_KEY_FILE=<empty file>`", "api_key_file", "put the API key",
         setup=_key_file(" \n")),
    Case("API key", "API key given twice (env and file)", "`VLLM_API_KEY=<key> API_KEY_FILE=<file>`",
         "api_key_file", "only one", setup=_key_file(SECRET, VLLM_API_KEY=SECRET)),
    # ---- media fetching
    Case("media", "a URL where a host name belongs", "`ALLOWED_MEDIA_DOMAINS=https://images.example.com/`",
         "allowed_media_domains", "host names", env={"ALLOWED_MEDIA_DOMAINS": "https://images.example.com/"}),
    Case("media", "a wildcard host (vLLM matches exactly)", "`ALLOWED_MEDIA_DOMAINS=*.example.com`",
         "allowed_media_domains", "host names", env={"ALLOWED_MEDIA_DOMAINS": "*.example.com"}),
    Case("media", "local media path = the whole file system", "`ALLOWED_LOCAL_MEDIA_PATH=/`",
         "allowed_local_media_path", "absolute path of a directory", env={"ALLOWED_LOCAL_MEDIA_PATH": "/"}),
    Case("media", "relative local media path", "`ALLOWED_LOCAL_MEDIA_PATH=images`", "allowed_local_media_path",
         "absolute path of a directory", env={"ALLOWED_LOCAL_MEDIA_PATH": "images"}),
)


def markdown_table() -> str:
    rows = ["| # | bad setting | given as | message names | fix mentions |",
            "|---|---|---|---|---|"]
    for number, c in enumerate(CASES, 1):
        judge = " (vLLM's parser)" if c.vllm else ""
        rows.append(f"| {number} | {c.what}{judge} | {c.given} | `{c.key}` "
                    f"| {c.fix.replace('|', '/')} |")
    return "\n".join(rows) + "\n"
