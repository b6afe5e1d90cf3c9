"""The API key clients send as `Authorization: Bearer ...`: the one reader every part of the kit uses.

Where it comes from: VLLM_API_KEY, or the file API_KEY_FILE names (a mounted Kubernetes Secret,
typically; surrounding whitespace is stripped). One behaviour everywhere, the launcher's: both set
is an error (which one would win is not obvious, and the server refuses to start with both), and
so is a key file that cannot be read or is empty. The launcher reports these as configuration
errors of `api_key_file`; the probe and the tools as usage errors (exit 2).

Standard library only, Python 3.7 or newer (see minicpmv_ascend.common).
"""

from __future__ import annotations

import pathlib
from typing import Mapping

KEY_ENV = "VLLM_API_KEY"
FILE_ENV = "API_KEY_FILE"


class ApiKeyError(Exception):
    """The key cannot be determined. `why` and `fix` are worded as the launcher reports them; the
    message is one line for the probe and the tools."""

    def __init__(self, why: str, fix: str, key_file: str | None = None) -> None:
        self.why, self.fix = why, fix
        where = f"{FILE_ENV}={key_file}: " if key_file else ""
        super().__init__(f"{where}{why}; {fix}")


def read_api_key(key: str | None, key_file: str | None, key_origin: str = f"env {KEY_ENV}") -> str | None:
    """The key given directly, or the contents of `key_file`; None when neither is set.

    `key_origin` says where `key` came from (the launcher's settings also take it from YAML or a
    flag), for the message when both are set.
    """
    if key and key_file:
        raise ApiKeyError(f"both api_key (from {key_origin}) and api_key_file are set",
                          f"set only one of them ({KEY_ENV} or {FILE_ENV})")
    if not key_file:
        return key or None
    try:
        secret = pathlib.Path(key_file).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise ApiKeyError(f"the key file cannot be read: {reason}",
                          "mount the secret at that path (readable by this user) or fix the path", key_file) from None
    if not secret:
        raise ApiKeyError("the key file is empty", "put the API key into the file (whitespace around it is ignored)",
                          key_file)
    return secret


def api_key_from_env(environ: Mapping[str, str]) -> str | None:
    """The key as the server's own environment gives it (the probe in the container sees the
    variables the server was started with)."""
    return read_api_key(environ.get(KEY_ENV), environ.get(FILE_ENV))
