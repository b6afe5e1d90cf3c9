"""The readers of vLLM's shared-memory message queue can sleep in their busy window."""

from __future__ import annotations

import functools
import math
import os
import time
from typing import Any

from ...core.patch import AT_REGISTER, LayoutNotFound, Patch
from ...core.vllm_code import function_source, require_source
from ...core.wrap import wrap_when_imported

NAME = "shm-busy-sleep"
ENV = "MINICPMV_ASCEND_PLUGIN_SHM_BUSY_SLEEP_S"
UPSTREAM_ENV = "VLLM_SHM_BROADCAST_BUSY_SLEEP_S"  # vLLM #52848's name for the same knob
SHM_BROADCAST = "distributed/device_communicators/shm_broadcast.py"
BUSY_BRANCH = "self.last_read + self.busy_loop_s"


def busy_sleep_s() -> float:
    """The variable's seconds (0 when unset); ValueError saying what to set for anything else."""
    text = os.environ.get(ENV, "").strip()
    try:
        seconds = float(text or 0)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 <= seconds <= 1):
        raise ValueError(f"{ENV}={text!r} is not a number of seconds from 0 to 1: set e.g. 0.0002 (a "
                         "reader of vLLM's message queue sleeps 0.2 ms between checks in its busy window), "
                         "or 0 / unset for vLLM's own busy loop")
    return seconds


def _wait(nap_s: float) -> Any:
    def make(original: Any) -> Any:
        @functools.wraps(original)
        def wait(self: Any, timeout_ms: int | None = None) -> None:
            busy = time.monotonic() <= self.last_read + self.busy_loop_s
            original(self, timeout_ms)
            if busy:
                time.sleep(nap_s)

        return wait

    return make


def check(_: Any) -> str | None:
    path, source = require_source(SHM_BROADCAST)
    if UPSTREAM_ENV in source:
        return f"vLLM reads {UPSTREAM_ENV} itself ({path}): set that"
    _, wait = function_source("wait", SHM_BROADCAST)
    if "class SpinCondition" not in source or BUSY_BRANCH not in wait:
        raise LayoutNotFound(f"vLLM's {path} has no SpinCondition.wait with a busy window ({BUSY_BRANCH})")
    return None


def apply(_: Any) -> None:
    nap_s = busy_sleep_s()  # an invalid value stops vLLM here, naming the variable
    if nap_s:
        wrap_when_imported((SHM_BROADCAST,), "SpinCondition.wait", _wait(nap_s))


PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary=f"{ENV}: vLLM's message-queue readers sleep that long between checks in their 1 s busy window",
    upstream=("vLLM #52848 (open: this variable), #52814 (open: the window instead), #28053 (the parking it keeps); "
              "its shm message-queue readers busy-loop 1 s after every message (0.23-0.33)"),
    check=check,
    apply=apply,
    fixes=("after every message the engine core and each worker busy-loop on `sched_yield()` for 1 s: on a 2-core "
           "host two processes stay runnable beside the API server and the model's threads (20 requests 0.5 s "
           "apart: 12.9 CPU-s); with the variable set they sleep between checks"),
    tests=("`plugin/tests/patches/lifecycle/test_shm_busy_sleep.py::test_shm_busy_sleep_naps_in_the_busy_window_only` (each target's "
           "`SpinCondition`); `tests/test_api.py::test_engine_and_worker_sleep_after_a_request` (0.32, the shared "
           "server: the launcher's default on a small host)"),
    delete_when=f"vLLM reads {UPSTREAM_ENV} itself (#52848), or its readers no longer busy-loop",
    details=f"""
wraps `SpinCondition.wait` (`{SHM_BROADCAST}`): when the call
falls in the busy window (less than `busy_loop_s` since the last read), vLLM's own wait runs (its
`sched_yield()`) and then the reader sleeps `{ENV}` seconds; outside the
window vLLM's parking on the notification socket is untouched. The variable is read once per
process when the patch is applied: unset or 0 installs nothing (vLLM's busy loop as it is), a value
outside 0-1 s or not a number stops vLLM with a message naming the variable. A reader then checks
the queue every ~0.2 ms (0.0002) instead of continuously: a step's message waits at most that much
longer, and an idle reader no longer takes a core's fair share from the processes that work.
Predicate: vLLM's source of the module (read without importing it) has `SpinCondition.wait` with
the busy branch (`{BUSY_BRANCH}`) and does not mention `{UPSTREAM_ENV}` (upstream's name for it).
""",
    evidence={"0.30.0": ("applied", (f"`{SHM_BROADCAST}:191-216`: `SpinCondition.wait` "
                                     f"calls `sched_yield()` while `current_time <= {BUSY_BRANCH}`; "
                                     "`busy_loop_s` defaults to 1 (`:134`) and neither call site (`:508`, `:583`) passes "
                                     "one"))},
)
