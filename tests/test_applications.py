"""What applications use, through the official `openai` client against the real server (shared,
default settings but for image URLs: `ALLOWED_MEDIA_DOMAINS=public,127.0.0.1`).

- One check per row of the feature table (docs/applications.md) (minicpmv_ascend.tools.features): a row without a
  check, or a check without a row, fails.
- Tool calling in depth: forced calls (`required`, a named function) well-formed with random
  weights (structured decoding writes the call; the plugin's json-whitespace patch lets it end),
  thinking on and off, streaming and not; what a client gets when a call is cut; an agent loop.
  `tool_choice=auto` on the model's own output format: tests/test_tool_parsing.py.
- Structured output with thinking on (reasoning first, then the constrained answer) and off, and
  which backend compiled it.
- Forced calls within their tool's whole schema: 56 answers of the random model through
  the guard and past it; the frameworks applications use (the openai client's `parse`, LangChain's
  `ChatOpenAI` from .venv-apps as a client process: tests/support/framework_client.py).

Random weights: answers are noise. Tests check types, shapes, and what the constraints guarantee.
"""

from __future__ import annotations

import base64
import http.server
import json
import pathlib
import re
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any, Literal

import openai
import pydantic
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessageToolCall

from minicpmv_ascend.common.http import Client
from minicpmv_ascend.tools import features
from support import raw_http
from support.images import data_url, png_bytes

REPO = pathlib.Path(__file__).resolve().parents[1]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Beijing"]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
                   "required": ["zone"]}}}
TOOLS = [WEATHER, TIME]
REQUIRED = {t["function"]["name"]: t["function"]["parameters"]["required"] for t in TOOLS}
ENUMS = {t["function"]["name"]: {k: v["enum"] for k, v in t["function"]["parameters"]["properties"].items()}
         for t in TOOLS}
OFF = {"chat_template_kwargs": {"enable_thinking": False}}
# With thinking on, a forced call or a constrained answer starts after </think>, which random weights
# never write: vLLM's per-request thinking budget ends the thinking after this many tokens.
BUDGET = {"thinking_token_budget": 8}
WEATHER_Q = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", timeout=180, max_retries=0)


def chat(client: openai.OpenAI, server: Any, messages: list, **kwargs: Any) -> ChatCompletion:
    kwargs.setdefault("max_tokens", 8)
    kwargs.setdefault("temperature", 0)
    return client.chat.completions.create(model=server.model, messages=messages, **kwargs)


def reasoning_of(message: Any) -> str | None:
    return getattr(message, "reasoning", None) or getattr(message, "reasoning_content", None)


def assert_runnable(call: ChatCompletionMessageToolCall) -> dict[str, Any]:
    """A call a client can run: a declared tool, JSON object arguments with every required field,
    values from the schema's enums exactly as declared (the regression test of the forced-call measurement: vLLM's
    grammar let whitespace surround a value, `" Paris\\r "`; the plugin's tightened grammar does not)."""
    assert isinstance(call, ChatCompletionMessageToolCall) and call.type == "function"
    name = call.function.name
    arguments = json.loads(call.function.arguments)
    assert isinstance(arguments, dict) and set(REQUIRED[name]) <= set(arguments), (name, arguments)
    for key, value in arguments.items():
        assert value in ENUMS[name][key], (name, key, value)
    return arguments


# --------------------------------------------------------------------------------------------
# One check per feature row
# --------------------------------------------------------------------------------------------


def check_chat(client, server):
    on = chat(client, server, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                               {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2+3?"}])
    assert isinstance(on, ChatCompletion) and reasoning_of(on.choices[0].message)
    off = chat(client, server, WEATHER_Q, extra_body=OFF)
    assert off.choices[0].message.content and not reasoning_of(off.choices[0].message)


def check_completions(client, server):
    response = client.completions.create(model=server.model, prompt="The quick brown fox", max_tokens=5, temperature=0)
    assert response.object == "text_completion" and isinstance(response.choices[0].text, str)
    assert response.usage.completion_tokens == 5


def check_responses(client, server):
    response = client.responses.create(model=server.model, input="What is 2+3?", max_output_tokens=16)
    assert response.object == "response" and "reasoning" in [item.type for item in response.output]
    assert response.usage.output_tokens_details.reasoning_tokens > 0
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
              "required": ["answer"], "additionalProperties": False}
    formatted = client.responses.create(
        model=server.model, input="Is Paris in France?", max_output_tokens=64, extra_body=OFF,
        text={"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}})
    assert json.loads(formatted.output_text)["answer"] in ("yes", "no")


def check_streaming(client, server):
    chunks = list(chat(client, server, WEATHER_Q, max_tokens=12, stream=True,
                       stream_options={"include_usage": True}))
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert sum(1 for d in deltas if reasoning_of(d)) >= 2
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12


def check_usage(client, server):
    usage = chat(client, server, WEATHER_Q, max_tokens=10).usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens and usage.completion_tokens == 10
    assert 0 < usage.completion_tokens_details.reasoning_tokens <= 10


def check_logprobs(client, server):
    response = chat(client, server, WEATHER_Q, max_tokens=4, logprobs=True, top_logprobs=3)
    content = response.choices[0].logprobs.content
    assert len(content) == 4 and all(len(token.top_logprobs) == 3 for token in content)
    assert all(token.logprob <= 0 for token in content)


def check_n(client, server):
    response = chat(client, server, WEATHER_Q, max_tokens=4, n=2, temperature=1.0, seed=7)
    assert [c.index for c in response.choices] == [0, 1]


def check_tools(client, server):
    for choice, thinking in (("required", OFF), ({"type": "function", "function": {"name": "get_weather"}}, BUDGET)):
        response = chat(client, server, WEATHER_Q, tools=TOOLS, tool_choice=choice, max_tokens=160,
                        seed=1, extra_body=thinking)
        calls = response.choices[0].message.tool_calls
        assert calls, response
        assert_runnable(calls[0])
    none = chat(client, server, WEATHER_Q, tools=TOOLS, tool_choice="none", max_tokens=8)
    assert not none.choices[0].message.tool_calls
    auto = chat(client, server, WEATHER_Q, tools=TOOLS, tool_choice="auto", max_tokens=8)
    assert auto.choices[0].finish_reason in ("stop", "length")  # random weights: no call, accepted


def check_structured(client, server):
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]},
                                               "confidence": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["answer", "confidence"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    for thinking in (OFF, BUDGET):
        message = chat(client, server, WEATHER_Q, response_format=fmt, max_tokens=120, seed=1,
                       extra_body=thinking).choices[0].message
        answer = json.loads(message.content)
        assert answer["answer"] in ("yes", "no") and 0 <= answer["confidence"] <= 9
        assert bool(reasoning_of(message)) == (thinking is BUDGET)
    regex = chat(client, server, WEATHER_Q, max_tokens=20, extra_body={**OFF, "structured_outputs": {"regex": r"\d{3}-[a-z]{2}"}})
    assert re.fullmatch(r"\d{3}-[a-z]{2}", regex.choices[0].message.content)
    choice = chat(client, server, WEATHER_Q, max_tokens=20, extra_body={**BUDGET, "structured_outputs": {"choice": ["red", "blue"]}})
    assert choice.choices[0].message.content in ("red", "blue")
    for thinking in (OFF, BUDGET):  # random weights: the object's keys never end; it is an object
        obj = chat(client, server, WEATHER_Q, max_tokens=40, response_format={"type": "json_object"},
                   extra_body=thinking).choices[0].message
        assert obj.content.startswith("{") and bool(reasoning_of(obj)) == (thinking is BUDGET)


def check_image_data(client, server):
    text = chat(client, server, WEATHER_Q)
    image = chat(client, server, [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(png_bytes(96, 64, (200, 40, 40)))}}, {"type": "text", "text": "What is this?"}]}])
    assert image.usage.prompt_tokens > text.usage.prompt_tokens + 16


def check_image_url(client, server):
    with ImageHost() as host:
        by_url = chat(client, server, [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"http://127.0.0.1:{host.port}/red.png"}},
            {"type": "text", "text": "What is this?"}]}])
    inline = chat(client, server, [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(host.png).decode()}},
        {"type": "text", "text": "What is this?"}]}])
    assert host.requests == ["/red.png"] and by_url.usage.prompt_tokens == inline.usage.prompt_tokens


def check_video(client, server):
    import cv2
    import numpy as np

    path = server.log_path.parent / "clip.mp4"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 4, (64, 48))
    for i in range(8):
        frame = np.zeros((48, 64, 3), np.uint8)
        frame[:, : 8 * (i + 1)] = (0, 0, 200)
        writer.write(frame)
    writer.release()
    url = "data:video/mp4;base64," + base64.b64encode(path.read_bytes()).decode()
    video = chat(client, server, [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": "What happens?"}]}])
    assert video.usage.prompt_tokens > chat(client, server, WEATHER_Q).usage.prompt_tokens + 16


class ParseAnswer(pydantic.BaseModel):
    answer: Literal["yes", "no"]
    confidence: int = pydantic.Field(ge=0, le=9)


class ParsePlace(pydantic.BaseModel):
    unit: Literal["m", "km"]


class ParseWeather(pydantic.BaseModel):
    """Current weather of a city."""

    city: Literal["Paris", "Rome"]
    place: ParsePlace


def check_openai_parse(client, server):
    """The openai client's own parsing: pydantic classes in, validated objects out, over 3 seeds."""
    for seed in range(3):
        answer = client.chat.completions.parse(
            model=server.model, messages=WEATHER_Q, response_format=ParseAnswer, max_tokens=200, temperature=1.0,
            seed=seed, extra_body=OFF).choices[0].message
        assert isinstance(answer.parsed, ParseAnswer), answer
        for choice in ("required", {"type": "function", "function": {"name": "ParseWeather"}}):
            message = client.chat.completions.parse(
                model=server.model, messages=WEATHER_Q, tools=[openai.pydantic_function_tool(ParseWeather)],
                tool_choice=choice, max_tokens=300, temperature=1.0, seed=seed, extra_body=OFF).choices[0].message
            assert message.tool_calls, (seed, choice, message)
            assert isinstance(message.tool_calls[0].function.parsed_arguments, ParseWeather), message


APPS_PYTHON = REPO / ".venv-apps" / "bin" / "python"


def check_langchain(client, server):
    """LangChain's ChatOpenAI in its own venv (requirements/apps.txt), as a client process of the
    server: tests/support/framework_client.py validates every answer with the application's pydantic models."""
    assert APPS_PYTHON.exists(), f"{APPS_PYTHON} is missing: build it with `make apps-tools`"
    done = subprocess.run([str(APPS_PYTHON), str(REPO / "tests" / "support" / "framework_client.py"), f"{server.base_url}/v1",
                           server.model], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["invoke"]["type"] == "AIMessage" and out["invoke"]["content"]
    assert out["stream"]["chunks"] >= 2 and out["stream"]["content"]
    assert len(out["bind_tools"]) == 6 and all(c["name"] == "GetWeather" for c in out["bind_tools"])
    assert len(out["structured"]) == 3


CHECKS: dict[str, Callable[[openai.OpenAI, Any], None]] = {
    name.removeprefix("check_"): function for name, function in globals().items() if name.startswith("check_")}


def test_every_feature_row_has_a_check_and_every_check_a_row():
    assert sorted(CHECKS) == sorted(f.key for f in features.FEATURES)


@pytest.mark.server
@pytest.mark.parametrize("feature", features.FEATURES, ids=lambda f: f.key)
def test_each_listed_feature_works_on_the_server(client, server, feature):
    CHECKS[feature.key](client, server)


# The rows that also run against a MiniCPM-V 4.7 server: those whose path 4.7 changes —
# its chat template and per-request thinking switch (chat, streaming, usage), tool calls and
# structured output after its reasoning (tools, structured), its processor and canvas M-RoPE
# (image_data, video). The others are the server's own code, the same for both models, proven above.
ROWS_47 = ("chat", "streaming", "usage", "tools", "structured", "image_data", "video")


@pytest.mark.server
@pytest.mark.parametrize("feature", ROWS_47)
def test_feature_rows_work_on_a_minicpmv47_server(server_47, feature):
    client = openai.OpenAI(base_url=f"{server_47.base_url}/v1", api_key="unused", timeout=180, max_retries=0)
    CHECKS[feature](client, server_47)


class ImageHost:
    """A loopback HTTP server with one PNG; records the paths requested."""

    def __init__(self) -> None:
        self.png, self.requests = png_bytes(64, 48, (200, 40, 40)), []
        host = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                host.requests.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(host.png)))
                self.end_headers()
                self.wfile.write(host.png)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]

    def __enter__(self) -> ImageHost:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# --------------------------------------------------------------------------------------------
# Tool calling in depth
# --------------------------------------------------------------------------------------------


def post(server: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    return Client(server.base_url, 60).post_json(path, body)


def streamed_calls(stream: Iterator[ChatCompletionChunk]) -> tuple[dict[int, dict[str, str]], str | None, str, str]:
    """(calls by index: name and assembled arguments, finish_reason, content, reasoning)."""
    calls: dict[int, dict[str, str]] = {}
    finish, content, reasoning = None, "", ""
    for chunk in stream:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
                entry["name"] += (call.function.name or "") if call.function else ""
                entry["arguments"] += (call.function.arguments or "") if call.function else ""
            content += choice.delta.content or ""
            reasoning += reasoning_of(choice.delta) or ""
            finish = choice.finish_reason or finish
    return calls, finish, content, reasoning


@pytest.mark.server
@pytest.mark.parametrize("thinking", [OFF, BUDGET], ids=["thinking off", "thinking on"])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}],
                         ids=["required", "named"])
def test_forced_calls_are_well_formed_streaming_or_not(client, server, choice, thinking):
    kwargs = dict(tools=TOOLS, tool_choice=choice, max_tokens=160, seed=3, extra_body=thinking)
    whole = chat(client, server, WEATHER_Q, **kwargs).choices[0]
    call = whole.message.tool_calls[0]
    arguments = assert_runnable(call)
    if isinstance(choice, dict):
        assert call.function.name == "get_time" and len(whole.message.tool_calls) == 1
    if thinking is BUDGET:  # the call is not in the reasoning; the arguments are enum values only
        reasoning = reasoning_of(whole.message)
        assert reasoning and "<tool_call>" not in reasoning and "<function=" not in reasoning
    calls, finish, _, streamed_reasoning = streamed_calls(chat(client, server, WEATHER_Q, stream=True, **kwargs))
    assert calls[0]["name"] == call.function.name  # the same seed: the same call
    assert json.loads(calls[0]["arguments"]) == arguments
    assert (streamed_reasoning or None) == (reasoning_of(whole.message) or None)


@pytest.mark.server
def test_a_call_cut_by_max_tokens_is_not_handed_out(client, server):
    """vLLM alone returns the cut call `<tool_call>\\n<function=get_weather>\\n` as a call with
    arguments `{}` (city missing) and, streaming, completes it to `{}` in the last chunk
    (tests/test_tool_guard.py replays those answers). With the kit: finish_reason "length" and no
    call a client could run, for every cut point."""
    for max_tokens in (4, 12, 16, 20):
        kwargs = dict(tools=[WEATHER], tool_choice="required", max_tokens=max_tokens, seed=1, extra_body=OFF)
        choice = chat(client, server, WEATHER_Q, **kwargs).choices[0]
        assert choice.finish_reason == "length", (max_tokens, choice)
        assert not choice.message.tool_calls, (max_tokens, choice.message.tool_calls)
        calls, finish, _, _ = streamed_calls(chat(client, server, WEATHER_Q, stream=True, **kwargs))
        assert finish == "length"
        for call in calls.values():  # the call's header may have been streamed: never runnable arguments
            try:
                arguments = json.loads(call["arguments"])
            except ValueError:
                continue  # incomplete JSON: no client runs it
            assert "city" in arguments, f"a call without its required argument at max_tokens={max_tokens}: {call}"


@pytest.mark.server
def test_a_forced_call_whose_thinking_never_ends(client, server):
    """Thinking on, no budget: the constraint starts after </think>, which random weights never
    write. The client gets the thinking, finish_reason "length" and no call, never "tool_calls"."""
    for stream in (False, True):
        kwargs = dict(tools=TOOLS, tool_choice="required", max_tokens=24, seed=1)
        if stream:
            calls, finish, _, reasoning = streamed_calls(chat(client, server, WEATHER_Q, stream=True, **kwargs))
        else:
            choice = chat(client, server, WEATHER_Q, **kwargs).choices[0]
            calls, finish, reasoning = choice.message.tool_calls, choice.finish_reason, reasoning_of(choice.message)
        assert finish == "length" and not calls and reasoning


@pytest.mark.server
def test_agent_loop_model_calls_client_answers_model_continues(client, server):
    """The loop agent frameworks run: tools offered, the model calls one, the client runs it and
    sends a `tool` message with the call's id, the model continues. The server renders the call and
    the result into the next prompt the way the chat template teaches (checked through /tokenize)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You can look up the weather."}, *WEATHER_Q]
    first = chat(client, server, messages, tools=TOOLS, tool_choice="required", max_tokens=160, seed=1, extra_body=OFF)
    call = first.choices[0].message.tool_calls[0]
    arguments = assert_runnable(call)
    result = json.dumps({"city": arguments.get("city", ""), "temperature": 21})
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": result}]
    second = chat(client, server, messages, tools=TOOLS, tool_choice="auto", max_tokens=8, extra_body=OFF)
    assert second.choices[0].finish_reason in ("stop", "length")
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 10
    tokens = post(server, "/tokenize", {"model": server.model, "messages": messages, "tools": TOOLS,
                                        "add_generation_prompt": True,
                                        "chat_template_kwargs": {"enable_thinking": False}})["tokens"]
    prompt = post(server, "/detokenize", {"model": server.model, "tokens": tokens})["prompt"]
    assert f"<tool_call>\n<function={call.function.name}>\n" in prompt
    assert f"<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>" in prompt
    assert len(tokens) == second.usage.prompt_tokens


@pytest.mark.server
def test_structured_output_is_compiled_by_xgrammar_with_the_whitespace_bound(client, server):
    """vLLM's `auto` backend picks xgrammar for these requests: the plugin's json-whitespace patch
    wraps xgrammar's compiler only, and random weights (which rank whitespace first) write runs of
    exactly its bound, never more (guidance would have let them run to max_tokens)."""
    from minicpmv_ascend_plugin.patches.api.json_whitespace import MAX_WHITESPACE

    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
              "required": ["answer"], "additionalProperties": False}
    content = chat(client, server, WEATHER_Q, max_tokens=120, seed=1, extra_body=OFF, response_format={
        "type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}}).choices[0].message.content
    runs = [len(run) for run in re.findall(r"[ \t\r\n]+", content)]
    assert json.loads(content)["answer"] in ("yes", "no")  # it ended: without the bound it never does
    assert max(runs) <= MAX_WHITESPACE, (runs, content)



# --------------------------------------------------------------------------------------------
# Forced calls hold their whole schema: the measurement
# --------------------------------------------------------------------------------------------

ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two lengths",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["a", "b", "unit"], "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 1000}, "b": {"type": "integer", "minimum": 0, "maximum": 1000},
        "unit": {"type": "string", "enum": ["m", "km"]}}}}}
STRICT_WEATHER = {"type": "function", "function": {**WEATHER["function"], "strict": True, "parameters": {
    **WEATHER["function"]["parameters"], "additionalProperties": False}}}
TOOL_SETS = {"weather+time": [STRICT_WEATHER, TIME], "add": [ADD]}
SEEDS = range(7)


def forced_answer(server: Any, tools: list, choice: Any, seed: int, stream: bool, guard: bool) -> dict[str, Any]:
    """One forced answer at temperature 1, thinking off: {"calls": [(name, arguments text)], "finish": ...}.
    `guard=False` spells the request's `tools` key with a JSON escape (`"tool\\u0073"`): vLLM reads
    the same request, the kit's guard (which looks for the bytes `"tools"`) lets the answer pass as
    vLLM wrote it, so the raw answer shows what the grammar alone holds."""
    body = json.dumps({"model": server.model, "messages": WEATHER_Q, "tools": tools, "tool_choice": choice,
                       "max_tokens": 400, "temperature": 1.0, "seed": seed, "stream": stream, **OFF})
    if not guard:
        body = body.replace('"tools":', '"tool\\u0073":', 1)
    status, answer = raw_http.send(server.base_url + "/v1/chat/completions", body.encode(), timeout=300)
    assert status == 200, answer[:500]
    raw = answer.decode()
    if not stream:
        choice_ = json.loads(raw)["choices"][0]
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in choice_["message"].get("tool_calls") or []]
        return {"calls": calls, "finish": choice_["finish_reason"]}
    assembled: dict[int, list[str]] = {}
    finish = None
    for line in raw.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice_ in json.loads(line[6:]).get("choices") or []:
            for call in (choice_.get("delta") or {}).get("tool_calls") or []:
                entry = assembled.setdefault(call["index"], ["", ""])
                entry[0] += (call.get("function") or {}).get("name") or ""
                entry[1] += (call.get("function") or {}).get("arguments") or ""
            finish = choice_.get("finish_reason") or finish
    return {"calls": [tuple(v) for _, v in sorted(assembled.items())], "finish": finish}


def schema_failures(answer: dict[str, Any], tools: list) -> list[str]:
    """Why each call of the answer breaks its tool's schema (jsonschema, the library the guard uses)."""
    import jsonschema

    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    failures = []
    for name, arguments in answer["calls"]:
        try:
            jsonschema.validate(json.loads(arguments), schemas[name])
        except (KeyError, ValueError, jsonschema.ValidationError) as error:
            failures.append(f"{name}({arguments!r}): {str(error).splitlines()[0]}")
    return failures


@pytest.mark.server
def test_forced_calls_satisfy_their_whole_schema_with_and_without_the_guard(server):
    """The measurement: 56 forced answers of the random model (7 seeds x 2 tool sets x
    required/named x stream/not), temperature 1, thinking off, each sent twice: through the kit's
    guard and past it (vLLM's raw answer). Every call satisfies its tool's JSON schema in both (the
    grammar carries it, not the filter), at least 45 answers of each hand out a call, and
    finish_reason is OpenAI's: "tool_calls" after a required call, "stop" after a named one
    (vllm-project/vllm#25054 measured OpenAI's API; vLLM maps it so)."""
    from concurrent.futures import ThreadPoolExecutor

    cases = [(tools_name, choice, seed, stream)
             for tools_name in TOOL_SETS for choice in ("required", "named") for seed in SEEDS for stream in (False, True)]
    assert len(cases) >= 50

    def run(case: tuple, guard: bool) -> dict[str, Any]:
        tools_name, choice, seed, stream = case
        tools = TOOL_SETS[tools_name]
        forced = choice if choice == "required" else {"type": "function", "function": {"name": tools[0]["function"]["name"]}}
        return forced_answer(server, tools, forced, seed, stream, guard)

    with ThreadPoolExecutor(8) as pool:
        guarded = list(pool.map(lambda c: run(c, True), cases))
        raw = list(pool.map(lambda c: run(c, False), cases))
    report = []
    for label, answers in (("guard", guarded), ("raw", raw)):
        with_call = sum(1 for a in answers if a["calls"])
        finishes = {}
        for case, answer in zip(cases, answers):
            finishes.setdefault((case[1], answer["finish"]), 0)
            finishes[(case[1], answer["finish"])] += 1
        report.append(f"{label}: {with_call}/{len(answers)} hand out a call; finish_reason {finishes}")
    print("\n" + "\n".join(report))
    for label, answers in (("guard", guarded), ("raw", raw)):
        failures = [(case, f) for case, answer in zip(cases, answers) for f in schema_failures(answer, TOOL_SETS[case[0]])
                    if answer["finish"] != "length" or label == "guard"]
        assert not failures, (label, failures[:5], report)
        assert sum(1 for a in answers if a["calls"]) >= 45, report
        for case, answer in zip(cases, answers):
            if answer["calls"] and answer["finish"] != "length":
                assert answer["finish"] == ("tool_calls" if case[1] == "required" else "stop"), (label, case, answer)
