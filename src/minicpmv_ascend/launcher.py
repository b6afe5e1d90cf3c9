"""Container entrypoint logic: resolve and validate the configuration, then exec vLLM.

    entrypoint.py [--config FILE] [--dry-run] [--help] [any vLLM serve flag ...]

Settings come from defaults < YAML (--config FILE or env CONFIG_FILE) < env vars < vLLM flags on
this command line (see `minicpmv_ascend.settings`). Configuration mistakes exit with code 2 and one
message before anything loads. On success the process *becomes* vLLM's API server (os.execvpe):
no wrapper process stays between the orchestrator's signals and vLLM.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import pathlib
import shlex
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from typing import NoReturn

from minicpmv_ascend import settings
from minicpmv_ascend.settings import SETTINGS, ConfigError, Plan

log = logging.getLogger("minicpmv_ascend.launcher")

RANDOM_WEIGHTS_WARNING = f"""\
##########################################################################################
WARNING: serving the embedded RANDOM-WEIGHT tiny checkpoint ({{path}}).
WARNING: every answer it gives is noise; it exists only to exercise the serving stack.
WARNING: to serve the real model set {settings.REAL_MODEL_HINT}
##########################################################################################"""


@dataclasses.dataclass
class Options:
    config: str | None = None
    dry_run: bool = False
    help: bool = False


def parse_own_args(argv: Sequence[str]) -> tuple[Options, list[str]]:
    """Take the launcher's own options out; everything else is for vLLM.

    Hand-rolled rather than argparse: argparse would accept abbreviations (`--conf`) and so
    swallow vLLM flags that merely start like ours.
    """
    options, rest = Options(), []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--dry-run":
            options.dry_run = True
        elif arg in ("-h", "--help"):
            options.help = True
        elif arg == "--config":
            if i + 1 >= len(args):
                raise ConfigError("config_file", '""', "cli flag --config", "--config needs a file name",
                                  "write --config /path/to/serve.yaml")
            options.config, i = args[i + 1], i + 1
        elif arg.startswith("--config="):
            options.config = arg.removeprefix("--config=")
        else:
            rest.append(arg)
        i += 1
    return options, rest


def help_text() -> str:
    lines = [
        __doc__.strip(),
        "",
        "Own options:",
        "  --config FILE  YAML file of settings (keys below); env CONFIG_FILE does the same",
        "  --dry-run      print the resolved settings and the vLLM command, start nothing",
        "  --help         this text",
        "",
        "Settings (YAML key / env var / vLLM flag = default):",
    ]
    for s in SETTINGS:
        flag = f" / {s.flag}" if s.flag and s.emit not in ("env", "launcher", "positional") else ""
        lines.append(f"  {s.name} / {s.env}{flag} = {s.display(s.default) or '(empty)'}")
    lines += ["", "Other flags go to `vllm serve` unchanged: python -m minicpmv_ascend.vllm_cli serve --help=all"]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# The embedded random-weight checkpoint
# --------------------------------------------------------------------------------------------


def _remove_abandoned_tmp_dirs(path: pathlib.Path) -> None:
    """Delete the leftovers of killed generations (their PID is gone); keep live ones."""
    for tmp in path.parent.glob(f".{path.name}.tmp-*"):
        pid = tmp.name.rpartition("-")[2]
        try:
            os.kill(int(pid), 0)
            alive = int(pid) != os.getpid()  # our own PID: a leftover from an earlier container
        except (ValueError, ProcessLookupError):
            alive = False
        except PermissionError:
            alive = True  # someone else's live process
        if not alive:
            shutil.rmtree(tmp, ignore_errors=True)


def ensure_embedded_checkpoint(path: pathlib.Path) -> bool:
    """Generate the tiny checkpoint once. Returns True if it was generated now.

    Written into a temporary sibling directory and renamed into place, so an interrupted run never
    leaves a half checkpoint that a later start would take for complete.
    """
    if path.is_dir():
        return False
    from minicpmv_ascend import checkpoint  # imports torch and transformers: only when needed

    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_tmp_dirs(path)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    log.warning("generating the embedded random-weight checkpoint into %s (once)", path)
    started = time.monotonic()
    try:
        checkpoint.generate(tmp, "tiny", 0)
        os.rename(tmp, path)
    except OSError:
        if not path.is_dir():  # another launcher may have won the rename race: that is fine
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.warning("generated %s in %.1f s", path, time.monotonic() - started)
    return True


# --------------------------------------------------------------------------------------------
# What is about to run, in words (dry run and the start-up log share it)
# --------------------------------------------------------------------------------------------


def _setting_lines(plan: Plan) -> list[str]:
    lines = []
    width = max(len(s.name) for s in SETTINGS)
    for s in SETTINGS:
        value = plan.resolution.values[s.name]
        shown = s.display(value.value) or '""'
        effective = plan.effective[s.name]
        if s.name == "model_path":
            shown = f"{shown} -> {plan.model}" if plan.embedded else shown
        elif s.name == "tool_call_parser" and effective is None:
            shown += "  (unused: enable_auto_tool_choice is false)"
        elif s.emit in ("value", "json", "list") and effective != value.value:
            shown += f" -> {s.display(effective) or 'not passed to vLLM'}"
        lines.append(f"  {s.name:<{width}} = {shown}  [{value.origin}]")
    return lines


def _env_lines(plan: Plan, environ: Mapping[str, str]) -> list[str]:
    lines = []
    for key, value in plan.env_defaults.items():
        if key in environ:
            lines.append(f"  {key}={environ[key]}  (yours; the launcher default {value} is not applied)")
        else:
            lines.append(f"  {key}={value}  (launcher default, set only because you did not set it)")
    if plan.api_key:
        lines.append(f"  VLLM_API_KEY={settings.REDACTED}  (the API key: only in vLLM's environment)")
    else:
        lines.append("  VLLM_API_KEY is not set: the API accepts requests without a key")
    return lines


def describe_plan(plan: Plan, environ: Mapping[str, str], python: str | None = None) -> str:
    lines = []
    if plan.embedded:
        lines += [RANDOM_WEIGHTS_WARNING.format(path=plan.model), ""]
    config = plan.resolution.config_file
    lines += [
        f"platform: {plan.platform}",
        f"config file: {config if config else '(none)'}",
        "settings (value [source]):",
        *_setting_lines(plan),
        "environment of vLLM:",
        *_env_lines(plan, environ),
    ]
    if plan.notes:
        lines += ["notes:", *(f"  {note}" for note in plan.notes)]
    lines += ["command:", "  " + shlex.join(settings.redact_args(plan.command(python)))]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def _configure_logging() -> None:
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s [minicpmv-ascend] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def prepare(argv: Sequence[str], environ: Mapping[str, str] | None = None,
            generate: bool = True) -> tuple[Options, Plan | None]:
    """Resolve, validate (vLLM's parser too where needed) and, if asked, generate the embedded checkpoint.

    Raises ConfigError. Returns (options, None) for --help.
    """
    environ = os.environ if environ is None else environ
    options, passthrough = parse_own_args(argv)
    if options.help:
        return options, None
    resolution = settings.resolve(passthrough, environ, options.config)
    platform = settings.detect_platform()
    plan = settings.build_plan(resolution, environ, platform)
    if generate and plan.embedded and plan.model_dir is not None and not plan.model_dir.is_dir():
        try:
            ensure_embedded_checkpoint(plan.model_dir)
        except OSError as err:  # typically a read-only or missing home directory in a container
            cache = resolution.values["cache_dir"]
            raise ConfigError("cache_dir", cache.value or settings.DEFAULT_CACHE_DIR, cache.origin,
                              f"cannot write the embedded checkpoint to {plan.model_dir}: {err}",
                              "set MINICPMV_CACHE_DIR to a writable directory, or MODEL_PATH to a "
                              "real checkpoint") from None
        plan = settings.build_plan(resolution, environ, platform)  # now checked against its config
    if importlib.util.find_spec("vllm") is None:
        plan.notes.append("vLLM is not installed here: the command line was not checked by its parser")
    elif options.dry_run or only_vllm_can_judge(resolution):
        settings.check_with_vllm(plan)
    return options, plan


def only_vllm_can_judge(resolution: settings.Resolution) -> bool:
    """Whether the configuration holds something only vLLM's own parser can check.

    Importing that parser costs ~10 s of CPU, and the exec'd vLLM parses the same command again.
    A command built from declared settings alone is known to parse (the tests check every
    declaration against vLLM's parser), so a start configured by env/YAML does not pay twice.
    Pass-through flags (which may be mistyped, or echo a secret in vLLM's error) and parser names
    are checked here, with this launcher's redaction and exit code 2.
    """
    # Parser names, and vLLM's compilation config (its keys and modes are vLLM's to judge).
    judged_by_vllm = ("reasoning_parser", "tool_call_parser", "compilation_config")
    return bool(resolution.passthrough) or any(resolution.values[n].source != "default" for n in judged_by_vllm)


def run(argv: Sequence[str] | None = None) -> int:
    """Return the exit code of --help, --dry-run or a configuration error; otherwise become vLLM."""
    _configure_logging()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        # A dry run has no side effects: it does not generate the embedded checkpoint.
        options, plan = prepare(argv, generate="--dry-run" not in argv)
    except ConfigError as err:
        print(f"minicpmv-ascend: {settings.redact_text(str(err), argv)}", file=sys.stderr)
        return settings.EXIT_CONFIG_ERROR
    if plan is None:
        print(help_text())
        return 0
    if options.dry_run:
        print("dry run: nothing is started\n" + describe_plan(plan, os.environ))
        return 0
    exec_vllm(plan)


def exec_vllm(plan: Plan) -> NoReturn:
    level = logging.WARNING if plan.embedded else logging.INFO
    log.log(level, "launch plan\n%s", describe_plan(plan, os.environ))
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # exec discards Python's buffers
    command = plan.command()
    os.execvpe(command[0], command, plan.exec_env(os.environ))


def main(argv: Sequence[str] | None = None) -> NoReturn:
    sys.exit(run(argv))


if __name__ == "__main__":
    main()
