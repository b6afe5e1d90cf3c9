"""Serving configuration: every setting declared once, everything else derived from it.

Precedence, lowest first: default < YAML file (`--config FILE` or env CONFIG_FILE) < env var <
command-line flag passed through to vLLM. Every resolved value remembers where it came from.

Public API (used by the launcher, the tools and the tests):
  resolve(cli_args, environ, config_file) -> Resolution   types, ranges, unknown keys; no I/O
                                                          beyond reading the YAML file
  build_plan(resolution, environ, platform) -> Plan      checkpoint, devices, dtype, API key;
                                                          the vLLM argv and exec environment
  check_with_vllm(plan)                                   vLLM's own argument parser (imports
                                                          vLLM: seconds, not milliseconds)
  ConfigError                                             exit code 2, one message
  SETTINGS, SETTINGS_BY_NAME, Setting                     the table
  markdown_table()                                        the reference (`python -m
                                                          minicpmv_ascend.settings --markdown`)

The package, one module per concern (each imports only the ones above it):
  types       value types and their ranges (pydantic), described for the docs
  table       the Setting record, the SETTINGS table, ConfigError
  layers      default < YAML < env < command line: resolve()
  platform    platform facts: devices, reasoning parsers, the embedded checkpoint's place
  checks      against the checkpoint and the platform
  plan        effective values, the vLLM command line and environment, redaction
  vllm_check  the cross-check with vLLM's own parser
  docs        the Markdown reference table
"""

from minicpmv_ascend.settings.docs import markdown_table
from minicpmv_ascend.settings.layers import Resolution, resolve
from minicpmv_ascend.settings.plan import MEDIA_FETCHING_OFF, Plan, build_plan, redact_args, redact_text
from minicpmv_ascend.settings.platform import (
    ascend_device_nodes,
    auto_reasoning_parser,
    detect_platform,
    embedded_checkpoint_dir,
    registered_reasoning_parsers,
    visible_device_count,
)
from minicpmv_ascend.settings.table import (
    CONFIG_FILE_ENV,
    DEFAULT_CACHE_DIR,
    EMBEDDED_CHECKPOINT_NAME,
    EXIT_CONFIG_ERROR,
    REAL_MODEL_HINT,
    REDACTED,
    SETTINGS,
    SETTINGS_BY_NAME,
    ConfigError,
    Setting,
    Value,
)
from minicpmv_ascend.settings.vllm_check import check_with_vllm

__all__ = [
    "CONFIG_FILE_ENV", "DEFAULT_CACHE_DIR", "EMBEDDED_CHECKPOINT_NAME", "EXIT_CONFIG_ERROR", "MEDIA_FETCHING_OFF",
    "REAL_MODEL_HINT", "REDACTED", "SETTINGS", "SETTINGS_BY_NAME", "ConfigError", "Plan", "Resolution", "Setting",
    "Value", "ascend_device_nodes", "auto_reasoning_parser", "build_plan", "check_with_vllm", "detect_platform",
    "embedded_checkpoint_dir", "markdown_table", "redact_args", "redact_text", "registered_reasoning_parsers",
    "resolve", "visible_device_count",
]
