"""The layers a setting's value comes from, lowest first: default < YAML file (`--config FILE` or
env CONFIG_FILE) < env var < command-line flag passed through to vLLM. Every resolved value
remembers where it came from; types, ranges and YAML keys are checked here (`resolve`).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import TypeAdapter, ValidationError

from minicpmv_ascend.settings.table import (
    CONFIG_FILE_ENV,
    REDACTED,
    SETTINGS,
    SETTINGS_BY_NAME,
    ConfigError,
    Setting,
    Source,
    Value,
    error,
    fix_where,
)
from minicpmv_ascend.settings.types import describe_type


@dataclasses.dataclass
class Resolution:
    values: dict[str, Value]
    passthrough: list[str]  # command-line args that are not settings: handed to vLLM unchanged
    config_file: pathlib.Path | None = None

    def __getitem__(self, name: str) -> Any:
        return self.values[name].value


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
                          f"set {fix_where(setting, Value(raw, source, origin))} to an allowed "
                          f"value: {describe_type(setting.type)} (default {default})") from None
    return Value(value, source, origin)


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


def flag_index() -> dict[str, tuple[Setting, bool | None]]:
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


def normalise_flag(arg: str) -> str:
    # vLLM's FlexibleArgumentParser treats --max_model_len as --max-model-len.
    return "--" + arg[2:].replace("_", "-") if arg.startswith("--") else arg


def reject_untracked_spelling(spelled: str, index: Mapping[str, tuple[Setting, bool | None]]) -> None:
    """vLLM's parser accepts abbreviations (--max-model 4096) and dotted forms
    (--limit-mm-per-prompt.image 3). Either would change a setting behind the launcher's back, so
    the listed plan would not be what runs. Checked here, without importing vLLM; a test shows no
    real vLLM flag is a strict prefix of a setting's flag, so no genuine flag is refused."""
    flag = normalise_flag(spelled)
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
    index = flag_index()
    values: dict[str, Value] = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        spelled, has_value, inline = arg.partition("=")
        hit = index.get(normalise_flag(spelled)) if arg.startswith("-") and "." not in spelled else None
        if hit is None and arg.startswith("--"):
            reject_untracked_spelling(spelled, index)
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
            raise error(setting, value, f"given twice on the command line: "
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
