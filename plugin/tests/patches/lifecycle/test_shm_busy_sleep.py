"""shm-busy-sleep on the target's own message queue: its `SpinCondition` (the reader side of the
queue between vLLM's engine core and its workers) called in its busy window, as `acquire_read`
calls it while no message has come. Without the variable the plugin installs nothing and each call
is vLLM's `sched_yield()`; with it each call also sleeps that long; a value that is not a number of
seconds stops the plugin's registration with a message naming the variable.
tests/test_api.py shows the result on vLLM 0.32's server (its engine core and worker sleep after a
request).
"""

from __future__ import annotations

import textwrap

from _target import results_each, run_python
from minicpmv_ascend_plugin.patches.lifecycle import shm_busy_sleep

CALLS, NAP_S = 10, 0.02  # 0.2 s of naps: inside the 1 s window; 10 sched_yields take microseconds

CODE = textwrap.dedent(f"""
    import json, tempfile, time
    import zmq
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    reader = SpinCondition(True, zmq.Context(), "ipc://" + tempfile.mktemp())
    reader.record_read()  # a message was just read: the busy window is open
    start = time.monotonic()
    for _ in range({CALLS}):
        reader.wait(timeout_ms=1000)
    print("RESULT " + json.dumps({{"seconds": time.monotonic() - start, "busy_loop_s": reader.busy_loop_s,
                                  "wrapped": hasattr(SpinCondition.wait, "_minicpmv_ascend_plugin_wraps")}}))
""")


def test_shm_busy_sleep_naps_in_the_busy_window_only(target):
    assert target.needs(shm_busy_sleep.NAME), "a target whose vLLM reads the variable itself: add its expectations"
    unset, napping = results_each(CODE, None, {shm_busy_sleep.ENV: str(NAP_S)})
    assert unset["busy_loop_s"] == napping["busy_loop_s"] == 1  # vLLM's window, unchanged
    assert not unset["wrapped"] and unset["seconds"] < CALLS * NAP_S, unset  # vLLM's busy loop as it is
    assert napping["wrapped"] and napping["seconds"] >= CALLS * NAP_S, napping
    invalid = run_python(CODE, env={shm_busy_sleep.ENV: "200us"})
    assert invalid.returncode != 0
    assert f"{shm_busy_sleep.ENV}='200us' is not a number of seconds" in invalid.stderr, invalid.stderr[-2000:]
