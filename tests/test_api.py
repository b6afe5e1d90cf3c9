"""The OpenAI-compatible API of the real vLLM CPU server, started through entrypoint.py.

The model has random weights, so the tests check shapes and behaviour, never the words.
"""

from __future__ import annotations

import json
import time

import openai
import psutil
import pytest

from minicpmv_ascend.settings.plan import SMALL_CPU_HOST_MAX_CPUS, usable_cpus
from minicpmv_ascend_plugin.patches.lifecycle import shm_busy_sleep
from support.images import png_url
from support.server import http_get

pytestmark = pytest.mark.server


def image_message(*urls: str, text: str = "Describe the image.") -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", timeout=120, max_retries=0)


def chat(client, server, messages, **kwargs):
    kwargs.setdefault("max_tokens", 8)
    kwargs.setdefault("temperature", 0)
    return client.chat.completions.create(model=server.model, messages=messages, **kwargs)


def test_vllm_loaded_the_checkpoint_strictly(server):
    """vLLM raises on any checkpoint weight it has no parameter for, and on any parameter the
    checkpoint does not fill; a ready server therefore proves an exact match of names and shapes."""
    assert "were not initialized" not in server.log_path.read_text()
    status, body = http_get(f"{server.base_url}/v1/models")
    assert status == 200
    assert [m["id"] for m in json.loads(body)["data"]] == [server.model]


def test_health_answers_200_and_metrics_show_vllm_counters(server):
    assert http_get(f"{server.base_url}/health")[0] == 200
    status, body = http_get(f"{server.base_url}/metrics")
    assert status == 200 and b"vllm:" in body


def test_text_chat_separates_thinking_from_content(client, server):
    response = chat(client, server, [{"role": "user", "content": "What is 2+3?"}])
    choice = response.choices[0]
    assert response.object == "chat.completion" and response.model == server.model
    assert choice.finish_reason in ("stop", "length")
    # Thinking is on by default: the template opens <think>, so every generated token before
    # </think> is reasoning; with 8 tokens of random weights the answer never leaves it.
    reasoning = getattr(choice.message, "reasoning", None) or getattr(choice.message, "reasoning_content", None)
    assert reasoning
    assert "<think>" not in (choice.message.content or "")
    usage = response.usage
    assert usage.completion_tokens == 8 if choice.finish_reason == "length" else usage.completion_tokens <= 8
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_thinking_off_puts_everything_in_content(client, server):
    response = chat(
        client, server, [{"role": "user", "content": "What is 2+3?"}],
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    message = response.choices[0].message
    assert not (getattr(message, "reasoning", None) or getattr(message, "reasoning_content", None))
    assert message.content


@pytest.mark.parametrize("size", [(448, 448), (1084, 820), (64, 512)])
def test_image_chat_adds_image_tokens(client, server, size):
    """1084x820 is a size where vLLM 0.23 miscounts placeholders (docs/design/ascend-stack.md,
    known problem 3); 0.32 must not."""
    text_only = chat(client, server, [{"role": "user", "content": "Describe the image."}])
    with_image = chat(client, server, image_message(png_url(*size)))
    assert with_image.choices[0].finish_reason in ("stop", "length")
    assert with_image.usage.prompt_tokens > text_only.usage.prompt_tokens + 16


def test_two_images_cost_more_than_one(client, server):
    one = chat(client, server, image_message(png_url(448, 448)))
    two = chat(client, server, image_message(png_url(448, 448), png_url(448, 448, (30, 30, 200))))
    assert two.usage.prompt_tokens > one.usage.prompt_tokens


def test_streaming_yields_several_chunks_and_usage(client, server):
    stream = chat(
        client, server, [{"role": "user", "content": "Count from one to ten."}],
        max_tokens=12, stream=True, stream_options={"include_usage": True},
    )
    chunks = list(stream)
    deltas = [c for c in chunks if c.choices]
    assert len(deltas) >= 3
    assert deltas[-1].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 12


def test_unknown_model_name_is_a_clean_404(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])


def test_engine_and_worker_sleep_after_a_request(client, server):
    """After a request, vLLM's engine core and worker wait on their message queue; for a second
    they busy-loop on `sched_yield()` (a runnable process each, ~a core beside a quiet machine).
    On a small host the launcher sets MINICPMV_ASCEND_PLUGIN_SHM_BUSY_SLEEP_S and the plugin's
    shm-busy-sleep makes them sleep between checks: their CPU in that second is a sliver."""
    if usable_cpus() > SMALL_CPU_HOST_MAX_CPUS:
        pytest.skip("a host with more CPUs: the launcher leaves vLLM's busy loop as it is")
    # each of vLLM's processes (API server, engine core, worker) logs its register() decisions
    registered = [line.split("): applied: ", 1)[1].split(";", 1)[0] for line in server.log_path.read_text().splitlines()
                  if "minicpmv_ascend_plugin " in line and "): applied: " in line]
    assert len(registered) >= 3 and all(shm_busy_sleep.NAME in applied.split(", ") for applied in registered), registered
    vllm_processes = psutil.Process(server.process.pid).children(recursive=True)
    chat(client, server, [{"role": "user", "content": "Hello"}])

    def cpu_s() -> float:
        return sum(sum(p.cpu_times()[:2]) for p in vllm_processes)

    before = cpu_s()
    time.sleep(0.6)  # inside the busy window that began with the request's last message
    assert cpu_s() - before < 0.2, "vLLM's engine core and worker spun after the request"
