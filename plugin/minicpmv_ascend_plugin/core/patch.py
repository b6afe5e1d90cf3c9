"""The patch record, its stages and a predicate's third outcome: what every patch module declares.

Nothing here imports vLLM: `register()` runs in every vLLM process, so the plugin's import must stay
cheap (vLLM itself is already imported when it runs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

# Stages: when a patch's predicate can be decided and the patch applied.
AT_REGISTER = "register"  # in register() itself (config hooks, parser registration)
AT_MODEL_IMPORT = "model-import"  # when vLLM imports its MiniCPM-V 4.6 model module
MODEL_MODULE = "vllm.model_executor.models.minicpmv4_6"


class LayoutNotFound(Exception):
    """A predicate's third outcome: the vLLM code it reads to decide is absent or unrecognizable
    (moved, renamed, rewritten), so it can tell neither "needed" nor "not needed".

    Raised by a predicate (the message says what it looked for); `register()` then leaves the patch
    unapplied and logs a WARNING naming it, and plugin/tests fail on it for every target.
    """


@dataclasses.dataclass(frozen=True)
class Patch:
    """One backport or fix, and everything there is to say about it (plugin/README.md links here).

    `check(target)` returns None when the patch applies and otherwise the reason it does not
    (feature detection first, version second), or raises `LayoutNotFound` when the code it reads
    is not there; `apply(target)` changes vLLM. `target` is the model module for AT_MODEL_IMPORT
    patches and None for AT_REGISTER ones.

    The rest is documentation, read here (Markdown): `summary` (one line: the patch table,
    `ascend_check.py`, `--decide`), `upstream` (the upstream bug or fix, or "none" and where the
    bug is), `fixes` (the bug, or what the patch changes), `tests` (the tests that show the bug
    without and the fix with the patch), `delete_when` (when the patch can go; plugin/README.md's
    patch list shows it beside a link to the record), `details` (how it works and how its
    predicate decides; continuation lines unindented), `evidence` (per vLLM release: (decision,
    where in that release's wheel it is decided)) and `files` (the modules that hold it, when more
    than its own). What the module's code holds, the prose takes from its constants
    (plugin/tests/core/test_patch_docs.py).
    """

    name: str
    stage: str
    summary: str
    upstream: str
    check: Callable[[Any], str | None]
    apply: Callable[[Any], None]
    fixes: str = ""
    tests: str = ""
    delete_when: str = ""
    details: str = ""
    evidence: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    files: tuple[str, ...] = ()
