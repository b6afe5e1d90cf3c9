"""The API-server patches (engine-death-exit, shutdown-cut-requests, uvicorn-signals,
shutdown-drain-503, file-url-400, image-bomb-400, public-media-urls, json-whitespace) on the
target's own code: each predicate finds the bug there, the patch changes what that vLLM does, and
each patch finds every place of that vLLM's module layout it must wrap.

The target's server loop runs for real in serve_harness.py (its `serve_http`, signal handler,
watchdog, `terminate_if_errored`, `/health` route, exception handler and `AsyncLLM.shutdown`)
around an engine client without an engine core; each scenario runs with the plugin and with
MINICPMV_ASCEND_PLUGIN=off (the bug). The same fixes are proven end to end on vLLM 0.32's real
server by tests/test_faults.py and tests/test_security.py.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import textwrap
import threading
import time

import pytest

from _harness import PLUGIN_OFF
from _target import SERVER_PATCHES, Forked, results_each, run_python

GRACE_S = 3  # shutdown_cut_requests.GRACE_S
DRAIN_S = 6  # serve_harness.DRAIN_S: the stand-in engine's drain (--shutdown-timeout)
NEW_REQUEST = "This server is shutting down and accepts no new requests"  # shutdown_drain_503
CUT_REQUEST = "This server shut down before the request finished"
HARNESS_TIMEOUT_S = 120  # start (a vLLM import, ~20 s here) + scenario
# With the fix the server stops within STOP_BOUND_S after SIGTERM (measured 3.1 s: GRACE_S and its
# exit, on both targets); without it, still running HANG_WAIT_S after SIGTERM is a hang.
STOP_BOUND_S = GRACE_S + 12
HANG_WAIT_S = STOP_BOUND_S + 5
# Every patch of the API server process whose predicate test_server_patch_predicates_decide_as_the_target_needs checks.
PREDICATES = (*SERVER_PATCHES, "uvicorn-signals", "json-whitespace")


def finish(process: Forked, timeout: float = HARNESS_TIMEOUT_S) -> tuple[int | None, dict, str]:
    """(exit code or None if it did not exit within `timeout` of its start, RESULT, output)."""
    try:
        code: int | None = process.wait(timeout=max(0.0, timeout - (time.monotonic() - process.started)))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        code = None
    process.reader.join(10)
    output = "".join(process.lines)
    line = next((l for l in reversed(output.splitlines()) if l.startswith("RESULT ")), "RESULT {}")  # the last
    return code, json.loads(line.removeprefix("RESULT ")), output


def finish_after_sigterm(process: Forked, wait_s: float = HANG_WAIT_S) -> tuple[int | None, dict, str]:
    """`finish`, giving the harness `wait_s` from the SIGTERM it sends itself (its start is vLLM's
    import, which takes longer while other harnesses start beside it)."""
    deadline = process.started + HARNESS_TIMEOUT_S
    while time.monotonic() < deadline and process.poll() is None:
        sigterm = next((l for l in list(process.lines) if l.startswith("SIGTERM at ")), None)
        if sigterm is not None:
            deadline = min(deadline, time.monotonic() + wait_s - (time.time() - float(sigterm.split()[-1])))
        time.sleep(0.2)
    return finish(process, timeout=0)


def seconds_since_sigterm(output: str) -> float:
    line = next((l for l in output.splitlines() if l.startswith("SIGTERM at ")), None)
    assert line is not None, "the harness never sent SIGTERM: " + output[-3000:]
    return time.time() - float(line.removeprefix("SIGTERM at "))


def test_server_patch_predicates_decide_as_the_target_needs(target):
    from PIL import Image

    import minicpmv_ascend_plugin as plugin
    from minicpmv_ascend_plugin.core import vllm_code
    from minicpmv_ascend_plugin.patches.media import data_url_400, file_url_400, image_bomb_400

    for patch in plugin.PATCHES:
        if patch.name in PREDICATES:
            assert (patch.check(None) is None) == target.needs(patch.name), (patch.name, patch.check(None))
    # The probes call vLLM's own loaders: file:// without a directory, and a decompression bomb.
    assert isinstance(file_url_400.probe(), RuntimeError) == target.needs("file-url-400")
    assert isinstance(data_url_400.probe(), NotImplementedError) == target.needs("data-url-400")
    assert isinstance(image_bomb_400.probe(), Image.DecompressionBombError) == target.needs("image-bomb-400")
    # json-whitespace: the target's xgrammar backend compiles without a bound, through self.compiler
    # (test_json_whitespace.py shows what that lets through).
    _, source = vllm_code.source_of("v1/structured_output/backend_xgrammar.py")
    assert ("max_whitespace_cnt" not in source and "self.compiler.compile_json_schema(" in source) == \
        target.needs("json-whitespace")


def test_engine_death_exits_1(target, waiting_harnesses):
    with_plugin, without = waiting_harnesses["death"]
    code, _, output = finish(with_plugin)
    off_code, _, off_output = finish(without)
    assert code == 1, output[-3000:]
    assert "the engine died: the API server stops and will exit with code 1" in output
    # Without the plugin: the bug (a dead engine looks like a clean stop), or this vLLM's own exit 1.
    assert off_code == (0 if target.needs("engine-death-exit") else 1), off_output[-3000:]


def error_message(out: dict, key: str) -> str:
    return json.loads(out[f"{key}_body"])["error"]["message"]


def test_sigterm_answers_the_cut_request_and_exits_0(target, waiting_harnesses):
    with_plugin, without = waiting_harnesses["sigterm"]
    code, out, output = finish(with_plugin)
    off_code, off_out, off_output = finish_after_sigterm(without)
    hung_for = seconds_since_sigterm(off_output) if off_code is None else 0.0
    assert code == 0, output[-3000:]  # a requested stop is not an engine death
    # The cut request is answered: a JSON 503 (shutdown-drain-503), else uvicorn's 500.
    if target.needs("shutdown-drain-503"):
        assert out["status"] == 503 and error_message(out, "status").startswith(CUT_REQUEST), out
    else:
        assert out["status"] == 500, out
    assert out["config_timeout_graceful_shutdown"] == GRACE_S
    assert out["stopped_after_sigterm_s"] < STOP_BOUND_S, out
    assert "exit with code" not in output
    if target.needs("shutdown-cut-requests"):
        # The bug: still waiting for the cut request's client, well past the bound of the fix.
        assert off_code is None and hung_for > STOP_BOUND_S, (hung_for, off_output[-3000:])
    else:
        assert off_code == 0 and off_out["status"] == 500, off_output[-3000:]


def test_drain_refuses_new_requests_and_answers_cut_ones_with_json_503(target, waiting_harnesses):
    """SIGTERM with a DRAIN_S (6 s) drain: a request that finishes 4 s into it is served; /health
    and a new request get 503 at once; a request cut by uvicorn and one that the target's own
    handler answers with EngineDeadError both get a JSON 503, and a stream cut the latter way ends
    with a 503 error event (shutdown-drain-503; on 0.23 also
    uvicorn-signals)."""
    assert target.needs("shutdown-drain-503"), "no target without the drain bug yet: add its expectations"
    with_plugin, without = waiting_harnesses["drain"]
    code, out, output = finish(with_plugin)
    off_code, off_out, off_output = finish_after_sigterm(without)
    assert code == 0, output[-3000:]
    assert out["slow"] == 200, out  # not cut GRACE_S after SIGTERM (0.23: uvicorn-signals)
    for key, message in (("health", NEW_REQUEST), ("new_request", NEW_REQUEST), ("status", CUT_REQUEST),
                         ("engine_dies", CUT_REQUEST)):
        assert out[key] == 503 and out[f"{key}_type"] == "application/json", (key, out)
        error = json.loads(out[f"{key}_body"])["error"]
        assert error["message"].startswith(message) and error["code"] == 503, (key, out)
        assert error["type"] == "ServiceUnavailableError", (key, out)
    # A stream that began before SIGTERM: its engine-died event becomes the cut request's 503 event.
    assert out["stream_engine_dies"] == 200 and out["stream_engine_dies_body"].endswith("data: [DONE]\n\n"), out
    last_event = out["stream_engine_dies_body"].split("\n\n")[-3].removeprefix("data: ")
    assert json.loads(last_event)["error"]["code"] == 503 and CUT_REQUEST in last_event, out
    assert out["health_s"] < 1 and out["new_request_s"] < 1, out  # at once, during the drain
    assert out["status_s"] < DRAIN_S + GRACE_S + 10 and out["stopped_after_sigterm_s"] < DRAIN_S + GRACE_S + 30, out
    # The target alone: the request the engine's death cut gets vLLM's 500; the other one is never
    # answered (its client gives up) and the server waits for it without end (shutdown-cut-requests'
    # bug); the one that finishes within the drain is served.
    assert off_code is None, off_output[-3000:]
    assert off_out["slow"] == 200 and off_out["engine_dies"] == 500, off_out
    assert "EngineCore encountered an issue" in off_out["engine_dies_body"], off_out
    assert off_out["stream_engine_dies"] == 200 and '"code": 500' in off_out["stream_engine_dies_body"], off_out
    assert "EngineCore encountered an issue" in off_out["stream_engine_dies_body"], off_out
    assert off_out["status"] == "TimeoutError", off_out
    if target.needs("uvicorn-signals"):
        # 0.23: uvicorn's own SIGTERM handler closes the port at once: /health and a new request
        # get "connection refused" for the whole drain.
        assert (off_out["health"], off_out["new_request"]) == ("URLError", "URLError"), off_out
        assert "Connection refused" in off_out["health_error"], off_out
    else:
        # vLLM's own NoSignalServer keeps the port open: /health says 200 and a new request is
        # accepted during the drain (on a real server it then fails with 500 "cannot schedule new
        # futures after shutdown": tests/test_faults.py on 0.32).
        assert (off_out["health"], off_out["new_request"]) == (200, 200), off_out


def test_drain_is_cut_after_3_s_without_uvicorn_signals(target, waiting_harnesses):
    """Why uvicorn-signals: the plugin with uvicorn's own SIGTERM handler put back (the harness
    undoes that one patch) cuts a request still running 3 s after SIGTERM (shutdown-cut-requests'
    grace, which uvicorn then counts from SIGTERM), although the drain lasts DRAIN_S."""
    if not target.needs("uvicorn-signals"):
        pytest.skip(f"{target.name} runs uvicorn without its signal handlers itself (NoSignalServer): "
                    "there is no patch to undo; its drain without the plugin keeps the port open and serves "
                    "the slow request (test_drain_refuses_new_requests_and_answers_cut_ones_with_json_503)")
    (process,) = waiting_harnesses["drain-uvicorn-signals"]
    code, out, output = finish(process)
    assert code == 0, output[-3000:]
    assert out["slow"] == 503 and out["slow_s"] < DRAIN_S, out  # cut ~3 s after SIGTERM


ERROR_RESPONSE = textwrap.dedent("""
    try:  # vLLM >= 0.30
        from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
    except ImportError:  # vLLM 0.23
        from vllm.entrypoints.serve.utils.error_response import create_error_response
""")


def test_media_loader_refusals_are_400s(target):
    """file:// without a directory, a non-base64 data URL, a decompression bomb, an image of an
    extreme aspect ratio: each a 400 with the plugin, on the target's own connector and loader."""
    code = ERROR_RESPONSE + textwrap.dedent("""
        import asyncio, json
        from vllm.multimodal.media.connector import MediaConnector
        from vllm.multimodal.media.image import ImageMediaIO
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        out = {}
        import base64, io
        from PIL import Image
        def png_url(width, height):
            buffer = io.BytesIO()
            Image.new("RGB", (width, height), (200, 40, 40)).save(buffer, "PNG")
            return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
        for name, size in (("wide", (1000, 4)), ("tall", (3, 2000)), ("fine", (400, 4))):
            for mode in ("sync", "async"):
                try:
                    if mode == "sync":
                        image = MediaConnector().fetch_image(png_url(*size))
                    else:
                        image = asyncio.run(MediaConnector().fetch_image_async(png_url(*size)))
                    out[f"{name}-{mode}"] = ["served", list(image.size), 200]
                except Exception as error:
                    out[f"{name}-{mode}"] = [type(error).__name__, str(error), create_error_response(error).error.code]
        for name, url in (("percent", "data:image/png,%89PNG%0D%0A"), ("plain", "data:,hello"),
                          ("charset", "data:image/png;charset=utf-8,%89PNG")):
            for mode in ("sync", "async"):
                try:
                    if mode == "sync":
                        MediaConnector().load_from_url(url, ImageMediaIO())
                    else:
                        asyncio.run(MediaConnector().load_from_url_async(url, ImageMediaIO()))
                except Exception as error:
                    out[f"{name}-{mode}"] = [type(error).__name__, str(error), create_error_response(error).error.code]
        for name, connector in (("none", MediaConnector()), ("dir", MediaConnector(allowed_local_media_path="/tmp"))):
            try:
                connector.load_from_url("file:///etc/hostname", ImageMediaIO())
            except Exception as error:
                out[name] = [type(error).__name__, str(error), create_error_response(error).error.code]
        from minicpmv_ascend_plugin.patches.media.image_bomb_400 import bomb_png
        try:
            ImageMediaIO().load_bytes(bomb_png())  # a PNG whose header says 14000x14000
        except Exception as error:
            out["bomb"] = [type(error).__name__, str(error), create_error_response(error).error.code]
        print("RESULT " + json.dumps(out))
    """)
    results = dict(zip(("plugin", "off"), results_each(code, None, PLUGIN_OFF)))
    kind, message, status = results["plugin"]["none"]
    assert (kind, status) == ("ValueError", 400)
    assert "Cannot load local files without `--allowed-local-media-path`" in message and "data: URL" in message
    if target.needs("file-url-400"):
        assert results["off"]["none"][0::2] == ["RuntimeError", 500]  # the bug
    else:
        assert results["off"]["none"][2] == 400
    for name in ("percent", "plain", "charset"):
        for case in (f"{name}-sync", f"{name}-async"):
            kind, message, status = results["plugin"][case]
            assert (kind, status) == ("ValueError", 400) and "only base64 data URLs" in message, (case, message)
            assert ";base64," in message
            off = results["off"][case]
            if not target.needs("data-url-400"):
                assert off[2] == 400
            elif name == "charset" or target.vllm != "0.23.0":
                assert off[0::2] == ["NotImplementedError", 501], off  # the bug
            else:  # 0.23 splits on the first ';' and fails without one: a 400 that says nothing useful
                assert off == ["ValueError", "not enough values to unpack (expected 2, got 1)", 400], off
    for case in ("wide-sync", "wide-async", "tall-sync", "tall-async"):
        kind, message, status = results["plugin"][case]
        assert (kind, status) == ("ValueError", 400) and "exceeds this server's limit of 200:1" in message, message
        if target.needs("image-shape-400"):
            assert results["off"][case][0] == "served", results["off"][case]  # the gap: any shape goes on
    assert results["plugin"]["fine-sync"] == results["plugin"]["fine-async"] == ["served", [400, 4], 200]
    # Outside the directory: vLLM's own ValueError (400), with and without the plugin.
    assert results["plugin"]["dir"][0::2] == results["off"]["dir"][0::2] == ["ValueError", 400]
    kind, message, status = results["plugin"]["bomb"]
    assert (kind, status) == ("ValueError", 400) and "decompression bomb" in message
    assert message.endswith("Downscale the image to at most 178956970 pixels and send it again."), message
    if target.needs("image-bomb-400"):
        assert results["off"]["bomb"][0::2] == ["DecompressionBombError", 500]  # the bug
    else:
        assert results["off"]["bomb"][2] == 400


def test_file_url_reads_are_bounded_on_the_targets_loader(target):
    """Inside the allowed directory, the target's own connector with the plugin: a file past the
    media download bound (here 1 MiB: VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB=1) is a 400 before a byte is
    read, as are a FIFO (at once: no writer ever comes), a directory and a path that does not exist
    (the double-encoded `%252e%252e`); a file within the bound is served. Without the plugin the
    loader reads the whole file (the recording media IO is handed all its bytes), a directory and a
    missing path are 500s."""
    code = ERROR_RESPONSE + textwrap.dedent("""
        import json, os, pathlib, tempfile, time
        from urllib3.util import parse_url
        from vllm.multimodal.media.connector import MediaConnector
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        class Recording:
            def get_max_bytes(self): return None
            def load_bytes(self, data): return len(data)
            def load_file(self, filepath): return len(pathlib.Path(filepath).read_bytes())
        root = pathlib.Path(tempfile.mkdtemp())
        (root / "big.bin").write_bytes(b"x" * (3 * 1024 * 1024))
        (root / "small.bin").write_bytes(b"x" * 1000)
        (root / "folder").mkdir()
        os.mkfifo(root / "fifo")
        connector = MediaConnector(allowed_local_media_path=str(root))
        out = {}
        cases = [("big", (root / "big.bin").as_uri()), ("small", (root / "small.bin").as_uri()),
                 ("folder", (root / "folder").as_uri()), ("missing", root.as_uri() + "/%252e%252e/small.bin")]
        if os.environ.get("MINICPMV_ASCEND_PLUGIN") != "off":  # vLLM alone blocks on it for good
            cases.append(("fifo", (root / "fifo").as_uri()))
        for name, url in cases:
            started = time.monotonic()
            try:
                out[name] = ["served", connector._load_file_url(parse_url(url), Recording()), 200]
            except Exception as error:
                out[name] = [type(error).__name__, str(error), create_error_response(error).error.code]
            out[name].append(round(time.monotonic() - started, 3))
        print("RESULT " + json.dumps(out))
    """)
    bound = {"VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB": "1"}
    results = dict(zip(("plugin", "off"), results_each(code, bound, PLUGIN_OFF | bound)))
    plugin, off = results["plugin"], results["off"]
    assert plugin["small"][:3] == ["served", 1000, 200] and off["small"][:3] == ["served", 1000, 200]
    assert plugin["big"][0::2][:2] == ["ValueError", 400] and "1048576 bytes" in plugin["big"][1], plugin["big"]
    for name in ("folder", "fifo"):
        kind, message, status, seconds = plugin[name]
        assert (kind, status) == ("ValueError", 400) and "not a regular file" in message and seconds < 1, plugin[name]
    assert plugin["missing"][0::2][:2] == ["ValueError", 400] and "No such file" in plugin["missing"][1]
    if target.needs("file-url-400"):  # the bug: the whole file, and 500s
        assert off["big"][:3] == ["served", 3 * 1024 * 1024, 200], off["big"]
        assert off["folder"][2] == off["missing"][2] == 500, off


def test_a_file_that_grows_past_the_bound_while_read_is_refused():
    """The size is checked before reading and the read stops one byte past the bound: a file whose
    size said less than it holds (as one still being written) is refused, not read whole."""
    from minicpmv_ascend_plugin.patches.media.file_url_400 import read_bounded

    status = pathlib.Path("/proc/self/status")  # a regular file whose size says 0; it holds ~1 KiB
    assert os.stat(status).st_size == 0 and len(status.read_bytes()) > 200
    with pytest.raises(ValueError, match="larger than this server's limit of 100 bytes"):
        read_bounded(status, 100)
    assert read_bounded(status, 1 << 20).startswith(b"Name:")


def test_plugin_off_registers_none_of_them():
    proc = run_python("from vllm.plugins import load_general_plugins\nload_general_plugins()\n"
                      "import minicpmv_ascend_plugin as p\nprint('RESULT', sorted(p.decisions()))",
                      env=PLUGIN_OFF)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "RESULT []" in proc.stdout


def test_public_media_urls_on_the_targets_connector(target):
    """`allowed_media_domains=public,127.0.0.1` on the target's own MediaConnector: the listed host is
    fetched, a loopback name and a redirect to it are refused (400) before any request reaches them;
    without the plugin vLLM's allow-list refuses every unlisted host, naming the setting (fail closed)."""
    import http.server
    import io

    from PIL import Image

    assert target.needs("public-media-urls"), "no target with public mode of its own yet: add its expectations"
    requests: list[str] = []
    png = io.BytesIO()
    Image.new("RGB", (32, 24), (200, 40, 40)).save(png, "PNG")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            if self.path.startswith("/hop"):
                self.send_response(302)
                self.send_header("Location", f"http://localhost:{self.server.server_address[1]}/secret.png")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(png.getvalue())))
            self.end_headers()
            self.wfile.write(png.getvalue())

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    code = ERROR_RESPONSE + textwrap.dedent(f"""
        import json
        from vllm.multimodal.media.connector import MediaConnector
        from vllm.multimodal.media.image import ImageMediaIO
        from vllm.plugins import load_general_plugins
        from minicpmv_ascend.server.media_urls import PUBLIC_SENTINEL
        load_general_plugins()
        connector = MediaConnector(allowed_media_domains=[PUBLIC_SENTINEL, "127.0.0.1"])
        out = {{}}
        for name, url in (("listed", "http://127.0.0.1:{port}/ok.png"), ("loopback", "http://localhost:{port}/x.png"),
                          ("redirect", "http://127.0.0.1:{port}/hop.png")):
            try:
                out[name] = ["ok", list(connector.load_from_url(url, ImageMediaIO()).size)]
            except Exception as error:
                out[name] = [type(error).__name__, str(error), create_error_response(error).error.code]
        print("RESULT " + json.dumps(out))
    """)
    results = {}
    try:
        for label, env in (("plugin", {"VLLM_MEDIA_URL_ALLOW_REDIRECTS": "1"}), ("off", PLUGIN_OFF)):
            requests.clear()
            proc = run_python(code, env=env)
            assert proc.returncode == 0, proc.stderr[-3000:]
            line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
            results[label] = (json.loads(line.removeprefix("RESULT ")), list(requests))
    finally:
        httpd.shutdown()
        httpd.server_close()
    out, seen = results["plugin"]
    assert out["listed"] == ["ok", [32, 24]]
    for name in ("loopback", "redirect"):
        assert out[name][0::2] == ["MediaURLRefused", 400] and "ALLOWED_MEDIA_DOMAINS=public" in out[name][1], out
    assert seen == ["/ok.png", "/hop.png"]  # the redirect's target was never requested
    out, seen = results["off"]
    assert out["loopback"][0::2] == ["ValueError", 400] and "public addresses only" in out["loopback"][1]
    assert "/x.png" not in seen


def module_bindings(name: str, start: str) -> set[str]:
    """Modules of the installed vLLM that hold `name` at module level, starting from `start` (where
    vLLM defines the one that matters) and following every `from <holder> import name`: each of
    them keeps its own reference, so a patch must wrap it in each. (Imports inside a function read
    the wrapped attribute when they run; other functions of the same name are not followed.)"""
    import ast

    from minicpmv_ascend_plugin.core.vllm_code import package_dir

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
    import fastapi._compat.v2, uvicorn.config, uvicorn.server
    import vllm.entrypoints.serve.sagemaker.api_router as invocations
    from vllm.multimodal.media.connector import MediaConnector
    from vllm.multimodal.media.image import ImageMediaIO
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend
    out["AsyncLLM.shutdown"] = wrapped(AsyncLLM.shutdown)
    out["uvicorn.Config.__init__"] = wrapped(uvicorn.config.Config.__init__)
    out["uvicorn.Config.load"] = wrapped(uvicorn.config.Config.load)
    out["uvicorn.Server.capture_signals"] = wrapped(uvicorn.server.Server.capture_signals)
    out["MediaConnector._load_file_url"] = wrapped(MediaConnector._load_file_url)
    out["MediaConnector._load_data_url"] = wrapped(MediaConnector._load_data_url)
    out["MediaConnector.fetch_image"] = wrapped(MediaConnector.fetch_image)
    out["MediaConnector.fetch_image_async"] = wrapped(MediaConnector.fetch_image_async)
    out["MediaConnector.load_from_url"] = wrapped(MediaConnector.load_from_url)
    out["MediaConnector.load_from_url_async"] = wrapped(MediaConnector.load_from_url_async)
    out["ImageMediaIO.load_bytes"] = wrapped(ImageMediaIO.load_bytes)
    out["fastapi ModelField.validate"] = wrapped(fastapi._compat.v2.ModelField.validate)
    out["/invocations TypeAdapter"] = type(invocations.pydantic).__name__ == "pydantic_for_invocations"
    out["XgrammarBackend.__post_init__"] = wrapped(XgrammarBackend.__post_init__)
    print("RESULT " + json.dumps(out))
""")

# Where each patch wraps (a place's name ends with the key), for the check below.
WRAPS = {"terminate_if_errored": "engine-death-exit", "run_server": "engine-death-exit",
         "AsyncLLM.shutdown": "engine-death-exit", "uvicorn.Config.__init__": "shutdown-cut-requests",
         "uvicorn.Config.load": "shutdown-drain-503", "uvicorn.Server.capture_signals": "uvicorn-signals",
         "MediaConnector._load_file_url": "file-url-400", "MediaConnector._load_data_url": "data-url-400",
         "MediaConnector.load_from_url": "public-media-urls",
         "MediaConnector.load_from_url_async": "public-media-urls", "MediaConnector.fetch_image": "image-shape-400",
         "MediaConnector.fetch_image_async": "image-shape-400", "ImageMediaIO.load_bytes": "image-bomb-400",
         "ModelField.validate": "request-type-400", "/invocations TypeAdapter": "request-type-400",
         "_parse_chat_message_content_part": "content-part-400",
         "_construct_message_from_response_item": "responses-assistant-content",
         "XgrammarBackend.__post_init__": "json-whitespace"}


def test_server_patches_wrap_every_place_of_this_layout(target):
    """vLLM moves these functions between releases (0.23: vllm/entrypoints/launcher.py, 0.30:
    vllm/entrypoints/launchers/launcher.py, each imported by name elsewhere; the chat parser:
    entrypoints/chat_utils.py on 0.23 and 0.30, renderers/ on 0.32): a patch that missed one would
    silently not apply there. Every holder found in this vLLM's source is wrapped where the target
    needs the patch, and nothing where it does not."""
    import vllm.entrypoints.cli.serve as cli_serve

    from minicpmv_ascend_plugin.core.vllm_code import API_SERVER_LAUNCHERS, module_name, source_of
    from minicpmv_ascend_plugin.patches.api import content_part_400, responses_assistant_content
    from minicpmv_ascend_plugin.patches.lifecycle import engine_death_exit

    launcher = source_of(*API_SERVER_LAUNCHERS)
    assert launcher is not None, f"none of {API_SERVER_LAUNCHERS} in this vLLM"
    holders = {
        "terminate_if_errored": module_bindings("terminate_if_errored", module_name(launcher[0])),
        "run_server": module_bindings("run_server", cli_serve.run_server.__module__),
        content_part_400.CALLER: module_bindings(
            content_part_400.CALLER, module_name(source_of(*content_part_400.CHAT_UTILS)[0])),
        responses_assistant_content.FUNCTION: module_bindings(
            responses_assistant_content.FUNCTION, module_name(source_of(*responses_assistant_content.UTILS)[0])),
    }
    assert holders["terminate_if_errored"] <= set(engine_death_exit.TERMINATE_MODULES), holders
    assert holders["run_server"] <= set(engine_death_exit.RUN_SERVER_MODULES), holders
    assert len(holders["terminate_if_errored"]) >= 2 and "vllm.entrypoints.cli.serve" in holders["run_server"]

    proc = run_python(WRAPPED, json.dumps({k: sorted(v) for k, v in holders.items()}))
    assert proc.returncode == 0, proc.stderr[-3000:]
    wrapped = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT ")).removeprefix("RESULT "))
    for place, is_wrapped in wrapped.items():
        patch = next(p for key, p in WRAPS.items() if place.endswith(key))
        assert is_wrapped == target.needs(patch), (place, wrapped)
    assert {WRAPS[next(k for k in WRAPS if place.endswith(k))] for place in wrapped} >= set(SERVER_PATCHES)
