"""minicpmv_ascend.common: what the host tools and the runtime share (standard library, Python 3.7).

Pure unit tests (no server); the modules also run under Python 3.7 in tests/test_host_python37.py.
"""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from minicpmv_ascend.common import api_key
from minicpmv_ascend.common.api_key import ApiKeyError, read_api_key
from minicpmv_ascend.common.http import Client, RequestFailed
from support.server import REPO, clean_env, free_port

# --------------------------------------------------------------------------------------------
# The API key: one reader, one behaviour


def test_api_key_from_either_place(tmp_path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("  from-file\n")
    assert read_api_key(None, None) is None and read_api_key("", "") is None
    assert read_api_key("direct", None) == "direct"
    assert read_api_key(None, str(key_file)) == "from-file"
    assert api_key.api_key_from_env({"API_KEY_FILE": str(key_file)}) == "from-file"
    assert api_key.api_key_from_env({"VLLM_API_KEY": "k", "API_KEY_FILE": ""}) == "k"  # empty = unset


def test_api_key_mistakes_are_errors_that_say_what_to_do(tmp_path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("secret")
    with pytest.raises(ApiKeyError) as both:
        api_key.api_key_from_env({"VLLM_API_KEY": "k", "API_KEY_FILE": str(key_file)})
    assert "both api_key (from env VLLM_API_KEY) and api_key_file are set" in str(both.value)
    assert "VLLM_API_KEY or API_KEY_FILE" in str(both.value)
    with pytest.raises(ApiKeyError, match=f"API_KEY_FILE={tmp_path / 'absent'}: the key file cannot be read: "
                                          "No such file or directory; mount the secret"):
        read_api_key(None, str(tmp_path / "absent"))
    key_file.write_text(" \n")
    with pytest.raises(ApiKeyError, match="the key file is empty; put the API key into the file"):
        read_api_key(None, str(key_file))
    with pytest.raises(ApiKeyError, match="cannot be read"):
        read_api_key(None, str(tmp_path))  # a directory


@pytest.mark.parametrize("tool", [
    ["healthcheck/probe.py", "live", "--url", "http://127.0.0.1:9"],
    ["-m", "minicpmv_ascend.tools.bench", "endpoint", "--base-url", "http://127.0.0.1:9", "--out", "{tmp}"],
    ["-m", "minicpmv_ascend.tools.parity", "--reference", "http://127.0.0.1:9", "--candidate", "http://127.0.0.1:9",
     "--out", "{tmp}", "--subset", "text"],
    ["-m", "minicpmv_ascend.tools.fuzz", "--url", "http://127.0.0.1:9", "--out", "{tmp}", "--st", sys.executable],
])
def test_every_tool_refuses_both_keys_with_a_usage_error(tool, tmp_path) -> None:
    """The probe and the tools read the key the same way: both set is exit 2 naming both,
    before any request is sent."""
    (tmp_path / "key").write_text("secret")
    args = [part.replace("{tmp}", str(tmp_path)) for part in tool]
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=REPO,
                            env=clean_env(VLLM_API_KEY="k", API_KEY_FILE=str(tmp_path / "key"),
                                          PYTHONPATH=str(REPO / "src")))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "VLLM_API_KEY or API_KEY_FILE" in result.stderr, result.stderr


# --------------------------------------------------------------------------------------------
# The HTTP client: one line per failure, a bound on the whole answer


class _Answers(http.server.BaseHTTPRequestHandler):
    """/ok: JSON; /error: vLLM's error body with 400; /text: not JSON; /trickle: 64 KiB every 0.6 s."""

    def do_GET(self) -> None:
        body = {"/ok": b'{"data": [1]}', "/error": b'{"error": {"message": "bad  thing\\n happened"}}',
                "/text": b"<html>", "/trickle": b"x" * 4 * 2**16}[self.path]
        self.send_response(400 if self.path == "/error" else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.path != "/trickle":
            self.wfile.write(body)
            return
        for start in range(0, len(body), 2**16):
            time.sleep(0.6)
            self.wfile.write(body[start:start + 2**16])
            self.wfile.flush()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def answers() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_client_answers_and_failures_are_one_line(answers) -> None:
    client = Client(answers, 5)
    assert client.get_json("/ok") == {"data": [1]}
    with pytest.raises(RequestFailed) as error:
        client.get("/error")
    assert str(error.value) == "GET /error: HTTP 400 bad thing happened"
    assert error.value.status == 400 and b"bad" in error.value.body  # what bench inspects
    with pytest.raises(RequestFailed, match=r"^GET /text: response is not JSON"):
        client.get_json("/text")


def test_client_bounds_the_whole_answer_not_each_read(answers) -> None:
    """A server that sends its answer in pieces, each faster than the socket timeout, is cut at the
    bound (after the piece that crosses it), not after the whole answer (2.4 s)."""
    started = time.monotonic()
    with pytest.raises(RequestFailed, match="timed out after 1 s reading the response"):
        Client(answers, 1).get("/trickle")
    assert time.monotonic() - started < 1.8


def test_client_says_nothing_listens() -> None:
    with pytest.raises(RequestFailed) as error:
        Client(f"http://127.0.0.1:{free_port()}", 5).get("/health")
    assert error.value.reason.startswith("connection refused: nothing listens on this port yet")
    assert error.value.status is None
