"""The cross-check with vLLM's own argument parser: the complete command parsed as `vllm serve`
will parse it (mistyped pass-through flags get vLLM's wording, a pass-through spelling that changes
a setting behind the launcher's back is refused), and parser names against vLLM's registries.
Imports vLLM: seconds, not milliseconds, so the launcher runs it only when it can find something.
"""

from __future__ import annotations

import argparse
import difflib
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from minicpmv_ascend.settings.layers import normalise_flag
from minicpmv_ascend.settings.plan import Plan, redact_args, redact_text, setting_argv
from minicpmv_ascend.settings.table import REDACTED, SETTINGS, SETTINGS_BY_NAME, ConfigError, error, fix_where


class _VllmRejected(Exception):
    pass


# What torch raises when a device-backend entry point fails to load (torch/__init__.py).
_BACKEND_LOAD_FAILED = "Failed to load the backend extension: torch_npu"


def vllm_parser() -> argparse.ArgumentParser:
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except RuntimeError as err:  # importing vLLM imports torch, which loads torch_npu on Ascend
        if _BACKEND_LOAD_FAILED not in str(err):
            raise
        raise ConfigError(
            "NPU driver", str(err.__cause__ or err), "torch_npu, loaded by `import torch`",
            "torch_npu cannot load, so neither can vLLM; most often the host's NPU driver libraries "
            "(libascend_hal.so) are not mounted into the container",
            "mount the host's /usr/local/Ascend/driver/lib64 and driver/version.info read-only (compose.yaml's "
            "NPU services do; Kubernetes: the driver-hostpath component), with the card's /dev/davinciN, "
            "and check `npu-smi info` on the host") from None

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
        raise error(setting, value, f"vLLM's CompilationConfig rejects it: {why}",
                    f"correct {fix_where(setting, value)} (its keys: `python -m minicpmv_ascend.vllm_cli "
                    "serve --help=CompilationConfig`); the Ascend decode-graph profile is "
                    '{"cudagraph_mode":"FULL_DECODE_ONLY"}') from None


def check_with_vllm(plan: Plan) -> None:
    """Parse the complete command with vLLM's serve parser, as `vllm serve` will."""
    parser = vllm_parser()
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
    flags = {normalise_flag(arg.partition("=")[0]) for arg in passthrough}
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
            raise error(setting, origin, f"this vLLM has no {name.replace('_', ' ')} named {value!r}",
                        f"{'did you mean ' + repr(close[0]) + '? ' if close else ''}set "
                        f"{fix_where(setting, origin)} to one of: {', '.join(known)}")
