"""Value types of the settings, with their ranges: validation and the docs read the same source.

pydantic validates a raw value (a YAML value, or the text of an env var or a flag) against a
setting's type; `describe_type` words the type and range for the docs table and fix hints.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from typing import Annotated, Any, Literal, get_args, get_origin

import annotated_types as at
from pydantic import AfterValidator, BeforeValidator

from minicpmv_ascend.server import media_urls


def _reject_bool(value: Any) -> Any:
    # pydantic's lax mode turns YAML `true` into 1; for a count that is always a mistake.
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")  # not TypeError: pydantic reports only ValueError
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
Thinking = Literal["auto", "on", "off"]


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
