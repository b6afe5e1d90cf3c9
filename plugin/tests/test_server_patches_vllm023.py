"""The API-server patches (engine-death-exit, shutdown-cut-requests, shutdown-drain-503,
file-url-400, image-bomb-400, public-media-urls) on vLLM 0.23's own code: each predicate finds the
bug there, and the patch changes what vLLM 0.23 does.

vLLM 0.23's server loop runs for real in serve_harness.py (its `serve_http`, signal handler,
watchdog, `terminate_if_errored` and `AsyncLLM.shutdown`) around an engine client without an
engine core; each scenario runs with the plugin and with MINICPMV_ASCEND_PLUGIN=off (the bug).
The same fixes are proven end to end on vLLM 0.32's real server by tests/test_faults.py and
tests/test_security.py.
"""

from __future__ import annotations

import json
import pathlib
import socket
import subprocess
import sys
import textwrap

from _vllm023 import REPO, run_python

HARNESS = pathlib.Path(__file__).with_name("serve_harness.py")
PLUGIN_OFF = {"MINICPMV_ASCEND_PLUGIN": "off"}
GRACE_S = 3  # shutdown_cut_requests.GRACE_S
DRAIN_S = 6  # serve_harness.DRAIN_S: the stand-in engine's drain (--shutdown-timeout)
NEW_REQUEST = "This server is shutting down and accepts no new requests"  # shutdown_drain_503
CUT_REQUEST = "This server shut down before the request finished"
HARNESS_TIMEOUT_S = 120  # start (a vLLM import, ~20 s here) + scenario
HANG_TIMEOUT_S = 60  # without the fix: still running this long after start (SIGTERM at ~22 s)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def harness(mode: str, env: dict[str, str] | None = None,
            timeout: float = HARNESS_TIMEOUT_S) -> tuple[int | None, dict, str]:
    """(exit code or None if it did not exit in time, RESULT, output) of serve_harness.py."""
    import os

    full_env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS" and not k.startswith("MINICPMV_")}
    full_env.update(env or {})
    process = subprocess.Popen([sys.executable, str(HARNESS), str(free_port()), mode], env=full_env, cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
        code: int | None = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        output, _ = process.communicate()
        code = None
    line = next((l for l in reversed(output.splitlines()) if l.startswith("RESULT ")), "RESULT {}")  # the last
    return code, json.loads(line.removeprefix("RESULT ")), output


def test_server_patch_predicates_find_the_bugs_in_vllm023():
    from PIL import Image

    from minicpmv_ascend_plugin import (
        engine_death_exit,
        file_url_400,
        image_bomb_400,
        shutdown_cut_requests,
        shutdown_drain_503,
    )

    assert engine_death_exit.check(None) is None  # terminate_if_errored only sets should_exit
    assert shutdown_cut_requests.check(None) is None  # uvicorn.Config without the timeout
    assert shutdown_drain_503.check(None) is None  # drains through engine_client.shutdown; /health
    assert file_url_400.check(None) is None  # vLLM's own loader raises RuntimeError
    assert isinstance(file_url_400.probe(), RuntimeError)
    assert image_bomb_400.check(None) is None  # vLLM's own image loader lets Pillow's error through
    assert isinstance(image_bomb_400.probe(), Image.DecompressionBombError)
    from minicpmv_ascend_plugin import _base, json_whitespace, public_media_urls

    assert public_media_urls.check(None) is None  # the host-name-only MediaConnector
    # json-whitespace: 0.23's xgrammar backend compiles without a bound, through self.compiler (the
    # vllm-ascend image has xgrammar; this venv holds vLLM's Python code only).
    _, source = _base.source_of("v1/structured_output/backend_xgrammar.py")
    assert "max_whitespace_cnt" not in source and "self.compiler.compile_json_schema(" in source
    assert json_whitespace.check(None) in (None, "xgrammar is not installed")


def test_engine_death_exits_1():
    code, out, output = harness("death")
    assert code == 1, output[-3000:]
    assert "the engine died: the API server stops and will exit with code 1" in output
    code, out, output = harness("death", PLUGIN_OFF)
    assert code == 0, output[-3000:]  # the bug: a dead engine looks like a clean stop


def test_sigterm_answers_the_cut_request_and_exits_0():
    code, out, output = harness("sigterm")
    assert code == 0, output[-3000:]  # a requested stop is not an engine death
    assert out["status"] == 503, out  # the cut request is answered (shutdown-drain-503: a JSON 503)
    assert json.loads(out["status_body"])["error"]["message"].startswith(CUT_REQUEST), out
    assert out["config_timeout_graceful_shutdown"] == GRACE_S
    assert out["stopped_after_sigterm_s"] < GRACE_S + 30, out  # bounded, generous margin
    assert "exit with code" not in output
    code, out, output = harness("sigterm", PLUGIN_OFF, HANG_TIMEOUT_S)
    assert code is None, output[-3000:]  # the bug: it waits for the cut request's client


def test_drain_refuses_new_requests_and_answers_cut_ones_with_json_503():
    """SIGTERM with a DRAIN_S (6 s) drain: a request that finishes 4 s into it is served; /health
    and a new request get 503 at once; a request cut by uvicorn and one that vLLM 0.23's handler
    answers with EngineDeadError both get a JSON 503 (shutdown-drain-503, uvicorn-signals)."""
    code, out, output = harness("drain")
    assert code == 0, output[-3000:]
    assert out["slow"] == 200, out  # uvicorn-signals: not cut GRACE_S after SIGTERM
    for key, message in (("health", NEW_REQUEST), ("new_request", NEW_REQUEST), ("status", CUT_REQUEST),
                         ("engine_dies", CUT_REQUEST)):
        assert out[key] == 503 and out[f"{key}_type"] == "application/json", (key, out)
        error = json.loads(out[f"{key}_body"])["error"]
        assert error["message"].startswith(message) and error["code"] == 503, (key, out)
        assert error["type"] == "ServiceUnavailableError", (key, out)
    assert out["health_s"] < 1 and out["new_request_s"] < 1, out  # at once, during the drain
    assert out["status_s"] < DRAIN_S + GRACE_S + 10 and out["stopped_after_sigterm_s"] < DRAIN_S + GRACE_S + 30, out
    code, out, output = harness("drain", PLUGIN_OFF, HANG_TIMEOUT_S)
    # vLLM 0.23 alone: uvicorn's own SIGTERM handler closes the port at once (/health and a new
    # request: connection refused, the whole drain); the request the engine's death cut gets
    # vLLM's 500; the other one is never answered (its client gives up) and the server waits for
    # it without end (shutdown-cut-requests' bug).
    assert code is None, output[-3000:]
    assert (out["health"], out["new_request"], out["slow"], out["engine_dies"]) == (
        "URLError", "URLError", 200, 500), out
    assert "Connection refused" in out["health_error"], out
    assert "EngineCore encountered an issue" in out["engine_dies_body"], out
    assert out["status"] == "TimeoutError", out


def test_drain_is_cut_after_3_s_without_uvicorn_signals():
    """Why uvicorn-signals: the plugin with uvicorn's own SIGTERM handler put back (the harness
    undoes that one patch) cuts a request still running 3 s after SIGTERM (shutdown-cut-requests'
    grace, which uvicorn then counts from SIGTERM), although the drain lasts DRAIN_S."""
    code, out, output = harness("drain", {"MINICPMV_HARNESS_UVICORN_SIGNALS": "on"})
    assert code == 0, output[-3000:]
    assert out["slow"] == 503 and out["slow_s"] < DRAIN_S, out  # cut ~3 s after SIGTERM


def test_file_url_without_directory_and_decompression_bomb_are_400s():
    code = textwrap.dedent("""
        import json, pathlib, sys
        # vLLM 0.23's error mapping imports FastAPI, which the 0.23 venv lacks: the CPU venv's.
        sys.path.extend(str(p) for p in sorted(pathlib.Path(".venv/lib").glob("python3.*/site-packages")))
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
        from minicpmv_ascend_plugin.image_bomb_400 import bomb_png
        try:
            ImageMediaIO().load_bytes(bomb_png())  # a PNG whose header says 14000x14000
        except Exception as error:
            out["bomb"] = [type(error).__name__, str(error), create_error_response(error).error.code]
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
    assert results["off"]["none"][0::2] == ["RuntimeError", 500]  # the bug
    # Outside the directory: vLLM's own ValueError (400), with and without the plugin.
    assert results["plugin"]["dir"][0::2] == results["off"]["dir"][0::2] == ["ValueError", 400]
    kind, message, status = results["plugin"]["bomb"]
    assert (kind, status) == ("ValueError", 400) and "decompression bomb" in message
    assert message.endswith("Downscale the image to at most 178956970 pixels and send it again."), message
    assert results["off"]["bomb"][0::2] == ["DecompressionBombError", 500]  # the bug


def test_plugin_off_registers_none_of_them():
    proc = run_python("from vllm.plugins import load_general_plugins\nload_general_plugins()\n"
                      "import minicpmv_ascend_plugin as p\nprint('RESULT', sorted(p.decisions()))",
                      env=PLUGIN_OFF)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "RESULT []" in proc.stdout


def test_public_media_urls_on_vllm023_connector():
    """`allowed_media_domains=public,127.0.0.1` on vLLM 0.23's own MediaConnector: the listed host is
    fetched, a loopback name and a redirect to it are refused (400) before any request reaches them;
    without the plugin vLLM's allow-list refuses every unlisted host, naming the setting (fail closed)."""
    import http.server
    import io
    import threading

    from PIL import Image

    requests: list[str] = []
    png = io.BytesIO()
    Image.new("RGB", (32, 24), (200, 40, 40)).save(png, "PNG")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
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
    code = textwrap.dedent(f"""
        import json, pathlib, sys
        sys.path.extend(str(p) for p in sorted(pathlib.Path(".venv/lib").glob("python3.*/site-packages")))
        from vllm.entrypoints.serve.utils.error_response import create_error_response
        from vllm.multimodal.media.connector import MediaConnector
        from vllm.multimodal.media.image import ImageMediaIO
        from vllm.plugins import load_general_plugins
        from minicpmv_ascend.media_urls import PUBLIC_SENTINEL
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
