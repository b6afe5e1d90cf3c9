"""The API-server patches (engine-death-exit, shutdown-cut-requests, file-url-400) on the target's
own code: each predicate finds the bug there, the patch changes what that vLLM does, and each
patch finds every place of that vLLM's module layout it must wrap.

The target's server loop runs for real in serve_harness.py (its `serve_http`, signal handler,
watchdog, `terminate_if_errored` and `AsyncLLM.shutdown`) around an engine client without an
engine core; each scenario runs with the plugin and with MINICPMV_ASCEND_PLUGIN=off (the bug).
The same fixes are proven end to end on vLLM 0.32's real server by tests/test_faults.py and
tests/test_security.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

from _target import REPO, SERVER_PATCHES, run_python

HARNESS = pathlib.Path(__file__).with_name("serve_harness.py")
PLUGIN_OFF = {"MINICPMV_ASCEND_PLUGIN": "off"}
GRACE_S = 3  # shutdown_cut_requests.GRACE_S
HARNESS_TIMEOUT_S = 120  # start (a vLLM import, ~20 s here) + scenario
HANG_TIMEOUT_S = 75  # without the fix: still running this long after start (SIGTERM at ~22-35 s)
STOP_BOUND_S = GRACE_S + 30  # with the fix the server stops within this after SIGTERM


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def harnesses(mode: str) -> Iterator[tuple[subprocess.Popen, subprocess.Popen]]:
    """serve_harness.py with the plugin and with MINICPMV_ASCEND_PLUGIN=off, started together
    (most of each run is vLLM's import, or waiting for a hang); both are killed on the way out."""
    processes = (start(mode), start(mode, PLUGIN_OFF))
    try:
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()


def start(mode: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    full_env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS" and not k.startswith("MINICPMV_")}
    full_env.update(env or {})
    process = subprocess.Popen([sys.executable, str(HARNESS), str(free_port()), mode], env=full_env, cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    process.started = time.monotonic()  # type: ignore[attr-defined]
    return process


def finish(process: subprocess.Popen, timeout: float = HARNESS_TIMEOUT_S) -> tuple[int | None, dict, str]:
    """(exit code or None if it did not exit within `timeout` of its start, RESULT, output)."""
    try:
        output, _ = process.communicate(timeout=max(0.0, timeout - (time.monotonic() - process.started)))
        code: int | None = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        code = None
    line = next((l for l in output.splitlines() if l.startswith("RESULT ")), "RESULT {}")
    return code, json.loads(line.removeprefix("RESULT ")), output


def seconds_since_sigterm(output: str) -> float:
    line = next((l for l in output.splitlines() if l.startswith("SIGTERM at ")), None)
    assert line is not None, "the harness never sent SIGTERM: " + output[-3000:]
    return time.time() - float(line.removeprefix("SIGTERM at "))


def test_server_patch_predicates(target):
    import minicpmv_ascend_plugin as plugin
    from minicpmv_ascend_plugin import file_url_400

    for patch in plugin.PATCHES:
        if patch.name in SERVER_PATCHES:
            assert (patch.check(None) is None) == target.needs(patch.name), (patch.name, patch.check(None))
    assert isinstance(file_url_400.probe(), RuntimeError) == target.needs("file-url-400")


def test_engine_death_exits_1(target):
    with harnesses("death") as (with_plugin, without):
        code, _, output = finish(with_plugin)
        off_code, _, off_output = finish(without)
    assert code == 1, output[-3000:]
    assert "the engine died: the API server stops and will exit with code 1" in output
    # Without the plugin: the bug (a dead engine looks like a clean stop), or this vLLM's own exit 1.
    assert off_code == (0 if target.needs("engine-death-exit") else 1), off_output[-3000:]


def test_sigterm_answers_the_cut_request_and_exits_0(target):
    with harnesses("sigterm") as (with_plugin, without):
        code, out, output = finish(with_plugin)
        off_code, off_out, off_output = finish(without, HANG_TIMEOUT_S)
        hung_for = seconds_since_sigterm(off_output) if off_code is None else 0.0
    assert code == 0, output[-3000:]  # a requested stop is not an engine death
    assert out["status"] == 500, out  # the cut request is answered
    assert out["config_timeout_graceful_shutdown"] == GRACE_S
    assert out["stopped_after_sigterm_s"] < STOP_BOUND_S, out
    assert "exit with code" not in output
    if target.needs("shutdown-cut-requests"):
        # The bug: still waiting for the cut request's client, well past the bound of the fix.
        assert off_code is None and hung_for > STOP_BOUND_S, (hung_for, off_output[-3000:])
    else:
        assert off_code == 0 and off_out["status"] == 500, off_output[-3000:]


def test_file_url_without_directory_is_a_400(target):
    code = textwrap.dedent("""
        import json
        try:  # vLLM >= 0.30
            from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
        except ImportError:  # vLLM 0.23
            from vllm.entrypoints.serve.utils.error_response import create_error_response
        from vllm.multimodal.media.connector import MediaConnector
        from vllm.multimodal.media.image import ImageMediaIO
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        out = {}
        for name, connector in (("none", MediaConnector()), ("dir", MediaConnector(allowed_local_media_path="/tmp"))):
            try:
                connector.load_from_url("file:///etc/hostname", ImageMediaIO())
            except Exception as error:
                out[name] = [type(error).__name__, str(error), create_error_response(error).error.code]
        print("RESULT " + json.dumps(out))
    """)
    results = {}
    for label, env in (("plugin", None), ("off", PLUGIN_OFF)):
        proc = run_python(code, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
        results[label] = json.loads(line.removeprefix("RESULT "))
    kind, message, status = results["plugin"]["none"]
    assert (kind, status) == ("ValueError", 400)
    assert "Cannot load local files without `--allowed-local-media-path`" in message and "data: URL" in message
    if target.needs("file-url-400"):
        assert results["off"]["none"][0::2] == ["RuntimeError", 500]  # the bug
    else:
        assert results["off"]["none"][2] == 400
    # Outside the directory: vLLM's own ValueError (400), with and without the plugin.
    assert results["plugin"]["dir"][0::2] == results["off"]["dir"][0::2] == ["ValueError", 400]


def test_plugin_off_registers_none_of_them():
    proc = run_python("from vllm.plugins import load_general_plugins\nload_general_plugins()\n"
                      "import minicpmv_ascend_plugin as p\nprint('RESULT', sorted(p.decisions()))",
                      env=PLUGIN_OFF)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "RESULT []" in proc.stdout


def module_bindings(name: str, start: str) -> set[str]:
    """Modules of the installed vLLM that hold `name` at module level, starting from `start` (where
    vLLM defines the one that matters) and following every `from <holder> import name`: each of
    them keeps its own reference, so a patch must wrap it in each. (Imports inside a function read
    the wrapped attribute when they run; other functions of the same name are not followed.)"""
    import ast

    from minicpmv_ascend_plugin._base import package_dir

    root = package_dir("vllm")
    imports: dict[str, set[str]] = {}  # module -> the modules it imports `name` from
    for path in root.rglob("*.py"):
        text = path.read_text(encoding="utf-8", errors="replace")
        if name not in text:
            continue
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.parse(text).body:
            if isinstance(node, ast.ImportFrom) and node.module and any(
                    a.name == name and (a.asname or a.name) == name for a in node.names):
                imports.setdefault(module, set()).add(node.module)
    holders = {start}
    while True:
        more = {m for m, sources in imports.items() if sources & holders} - holders
        if not more:
            return holders
        holders |= more


WRAPPED = textwrap.dedent("""
    import importlib, json, sys
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    wrapped = lambda f: getattr(f, "_minicpmv_ascend_plugin_wraps", None) is not None
    out = {}
    for name, modules in json.loads(sys.argv[1]).items():
        for module in modules:
            out[f"{module}.{name}"] = wrapped(getattr(importlib.import_module(module), name))
    import uvicorn.config
    from vllm.multimodal.media.connector import MediaConnector
    from vllm.v1.engine.async_llm import AsyncLLM
    out["AsyncLLM.shutdown"] = wrapped(AsyncLLM.shutdown)
    out["uvicorn.Config.__init__"] = wrapped(uvicorn.config.Config.__init__)
    out["MediaConnector._load_file_url"] = wrapped(MediaConnector._load_file_url)
    print("RESULT " + json.dumps(out))
""")


def test_server_patches_wrap_every_place_of_this_layout(target):
    """vLLM moves these functions between releases (0.23: vllm/entrypoints/launcher.py, 0.30:
    vllm/entrypoints/launchers/launcher.py, each imported by name elsewhere): a patch that missed
    one would silently not apply there. Every holder found in this vLLM's source is wrapped."""
    import subprocess

    from minicpmv_ascend_plugin import engine_death_exit

    import vllm.entrypoints.cli.serve as cli_serve
    from minicpmv_ascend_plugin._base import API_SERVER_LAUNCHERS, source_of

    launcher = source_of(*API_SERVER_LAUNCHERS)
    assert launcher is not None, f"none of {API_SERVER_LAUNCHERS} in this vLLM"
    holders = {
        "terminate_if_errored": module_bindings(
            "terminate_if_errored", "vllm." + launcher[0].removesuffix(".py").replace("/", ".")),
        "run_server": module_bindings("run_server", cli_serve.run_server.__module__),
    }
    assert holders["terminate_if_errored"] <= set(engine_death_exit.TERMINATE_MODULES), holders
    assert holders["run_server"] <= set(engine_death_exit.RUN_SERVER_MODULES), holders
    assert len(holders["terminate_if_errored"]) >= 2 and "vllm.entrypoints.cli.serve" in holders["run_server"]

    env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS" and not k.startswith("MINICPMV_")}
    proc = subprocess.run([sys.executable, "-c", WRAPPED, json.dumps({k: sorted(v) for k, v in holders.items()})],
                          capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    wrapped = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT ")).removeprefix("RESULT "))
    needs = {"terminate_if_errored": "engine-death-exit", "run_server": "engine-death-exit",
             "AsyncLLM.shutdown": "engine-death-exit", "uvicorn.Config.__init__": "shutdown-cut-requests",
             "MediaConnector._load_file_url": "file-url-400"}
    for place, is_wrapped in wrapped.items():
        patch = next(p for key, p in needs.items() if place.endswith(key))
        assert is_wrapped == target.needs(patch), (place, wrapped)
