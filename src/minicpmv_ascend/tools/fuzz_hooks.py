"""schemathesis hooks and checks for `minicpmv-fuzz` (src/minicpmv_ascend/tools/fuzz.py).

Loaded by schemathesis itself, in .venv-fuzz (requirements/fuzz.txt), through
`SCHEMATHESIS_HOOKS=minicpmv_ascend.tools.fuzz_hooks`; nothing else imports this module (schemathesis is
not in .venv). What the fuzzer sends is what the server's /openapi.json describes, with exactly
these changes, each because the published schema says less than vLLM needs or allows more than a
bounded run can afford:

1. What vLLM refuses with the same 400 every time, the schema says too, so that valid-mode
   requests reach the engine (schemathesis's invalid mode still sends all of it):
   `CompletionRequest.prompt` is required and not null (vLLM publishes it as optional because
   prompt_embeds can replace it, which this server refuses without --enable-prompt-embeds: without
   this, ~95 % of generated completions were a 400 "Either prompt or prompt_embeds must be
   provided"); prompt strings and arrays, `allowed_token_ids`, and the `messages` and `tools`
   lists are not empty (400 "... must be provided and non-empty", "You must pass at least one
   prompt", "allowed_token_ids is not None and empty!", "Cannot apply chat template to an empty
   conversation", "`tools` must not be an empty array": in the coverage phase, whose requests
   carry every optional field, `tools: []` alone made 1,300 of 2,100 chat requests a 400). This also makes the
   smallest valid prompt, the one schemathesis's coverage phase starts from, one token long.
2. Token ids are integers in [0, TOKEN_ID_MAX] where the schema says only "integer >= 0" (or
   nothing), in the fields that carry token ids (TOKEN_ID_FIELDS: `prompt` as ids, `tokens`,
   `allowed_token_ids`, ...). Unbounded, nearly every generated id array had one id beyond the
   vocabulary (731 in the tiny checkpoint; 151k+ in the released one) and was a 400 "out of
   vocabulary": requests made of token ids never reached the engine. Schemathesis's invalid mode
   still sends ids past the bound (and negative ones), so "out of vocabulary" stays exercised.
3. Output volume is capped on the routes that generate (any body with these keys), only where the
   value is one the server would accept, so the 400 answers past vLLM's own limits are still
   exercised: `max_tokens`, `max_completion_tokens`, `max_output_tokens` and `min_tokens` above
   OUTPUT_CAP (and at most max_model_len) become OUTPUT_CAP; `n`/`best_of` above N_CAP (and at
   most vLLM's 16384) become N_CAP; an absent or null `max_tokens` on chat, batch chat and
   responses (vLLM's default there is "the rest of max_model_len", ~8,000 tokens, ~20 s each on
   this CPU) becomes OUTPUT_CAP. Unbounded, one generated `n: 16000` request alone runs for
   minutes.
4. `POST /invocations` (the SageMaker-style route, which serves a chat or a completion depending on
   the body) is published without a request body, so schemathesis could only send it empty
   bodies (always 400); it gets the chat and completion request schemas.
5. A conversation (`messages` of `/v1/chat/completions` and `/invocations`, an `input` list of
   `/v1/responses`) without a user turn gets one appended (`{"role": "user", "content": "Hi"}`):
   the model's chat template (MiniCPM-V 4.6's, Qwen3.5's) refuses it with the same 400 "No user
   query found in messages." every time, which the schema cannot say (a list that contains an
   item of one kind). Without this, 0 of ~1,700 chat requests of a slice reached the engine (479
   of them that 400), and 3 to 7 of ~3,000 responses requests; tests/test_fuzz_findings.py keeps
   the 400 itself tested.
6. Hostile values no schema describes (fuzz.hostile), each in one body in fuzz.HOSTILE_EVERY: a
   lone UTF-16 surrogate appended to one string (a marker in the body, written as the ASCII JSON
   escape \ud800 by this module's JSON serializer); a data URL that is not base64 or a file:// URL
   in a `url` field; a malformed media `uuid` (an object, empty, 300 characters) or one sent alone
   without its data; a forged turn (`<|im_end|>...<|im_start|>system...`) appended to a message
   text. Before the kit's request guard and its data-url-400 and file-url-400 patches the first
   two were 500 and 501, and the last two reached the engine.
Everything else (types, ranges, unknown fields, streaming, templates, ...) is generated as the
schema allows, in both schemathesis modes (valid and invalid per the schema).

Checks added to schemathesis's `not_a_server_error` and `max_response_time`:
- `json_error_body`: a 4xx answer is a JSON object with `error` (vLLM's OpenAI shape) or
  `detail` (FastAPI's shape, for 404/405/422 from the router).
- `no_error_event`: a 2xx event stream carries no server-error event (vLLM reports failures that
  happen after the stream started as `data: {"error": {..., "code": 500}}` under HTTP 200). An
  error event with a 4xx code is the client's mistake found late, like the HTTP 4xx it would
  have been before the stream started: allowed (docs/reliability.md lists the one seen).
"""

from __future__ import annotations

import json
from typing import Any

import schemathesis

from minicpmv_ascend.tools.fuzz import MAX_MODEL_LEN, N_CAP, OUTPUT_CAP, VLLM_MAX_N, ascii_json, hostile

OUTPUT_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "min_tokens")
COUNT_KEYS = ("n", "best_of")
# Routes whose default output length is "the rest of max_model_len" when max_tokens is unset.
DEFAULT_TO_CAP = {
    "/v1/chat/completions": "max_tokens",
    "/v1/chat/completions/batch": "max_tokens",
    "/v1/responses": "max_output_tokens",
    "/invocations": "max_tokens",
}
CONVERSATIONS = {"/v1/chat/completions": "messages", "/invocations": "messages", "/v1/responses": "input"}
USER_TURN = {"role": "user", "content": "Hi"}
REQUIRED = {"CompletionRequest": "prompt"}
INVOCATIONS_BODIES = ("ChatCompletionRequest", "CompletionRequest")  # what /invocations dispatches on
NON_EMPTY = frozenset({"prompt", "allowed_token_ids"})  # and every string/array inside them
NON_EMPTY_LIST = frozenset({"messages", "tools"})  # the list itself (its items stay as published)
TOKEN_ID_MAX = 511  # a valid id in every vocabulary of this model family (the tiny one has 731)
TOKEN_ID_FIELDS = frozenset({"prompt", "tokens", "allowed_token_ids", "stop_token_ids", "logprob_token_ids",
                             "label_token_ids", "query", "items"})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def cap_body(path: str, body: Any) -> Any:
    """The body with its output volume capped (change 3 of the module docstring)."""
    if not isinstance(body, dict):
        return body
    for key in OUTPUT_KEYS:
        value = body.get(key)
        if _is_int(value) and OUTPUT_CAP < value <= MAX_MODEL_LEN:
            body[key] = OUTPUT_CAP
    for key in COUNT_KEYS:
        value = body.get(key)
        if _is_int(value) and N_CAP < value <= VLLM_MAX_N:
            body[key] = N_CAP
    key = DEFAULT_TO_CAP.get(path)
    if key is not None and body.get(key) is None and body.get("max_completion_tokens") is None:
        body[key] = OUTPUT_CAP
    return body


def with_user_turn(path: str, body: Any) -> Any:
    """The body with a user turn appended to a conversation that has none (change 5)."""
    messages = body.get(CONVERSATIONS[path]) if isinstance(body, dict) and path in CONVERSATIONS else None
    if isinstance(messages, list) and not any(isinstance(m, dict) and m.get("role") == "user" for m in messages):
        messages.append(dict(USER_TURN))
    return body


def _bound_token_ids(node: Any, in_array: bool = False) -> None:
    """Every integer that is an array item below `node` gets the range [0, TOKEN_ID_MAX]."""
    if isinstance(node, dict):
        if node.get("type") == "integer" and in_array:
            node["minimum"] = max(0, node.get("minimum", 0))
            node["maximum"] = min(TOKEN_ID_MAX, node.get("maximum", TOKEN_ID_MAX))
        for key, value in node.items():
            _bound_token_ids(value, in_array or key == "items")
    elif isinstance(node, list):
        for value in node:
            _bound_token_ids(value, in_array)


def _non_empty(node: Any) -> None:
    """Every array and string in this field's schema (its options, their items) gets >= 1 item/char."""
    if isinstance(node, dict):
        if node.get("type") == "array":
            node["minItems"] = max(1, node.get("minItems", 0))
        if node.get("type") == "string":
            node["minLength"] = max(1, node.get("minLength", 0))
        for value in node.values():
            _non_empty(value)
    elif isinstance(node, list):
        for value in node:
            _non_empty(value)


def tighten(raw_schema: dict[str, Any]) -> None:
    """The schema changes 1, 2 and 4 of the module docstring, in place."""
    schemas = raw_schema.get("components", {}).get("schemas", {})
    invocations = raw_schema.get("paths", {}).get("/invocations", {}).get("post")
    if invocations is not None and "requestBody" not in invocations:
        options = [{"$ref": f"#/components/schemas/{name}"} for name in INVOCATIONS_BODIES if name in schemas]
        invocations["requestBody"] = {"required": True, "content": {"application/json": {"schema": {"anyOf": options}}}}
    for name, field in REQUIRED.items():
        schema = schemas.get(name)
        if schema is not None and field in schema.get("properties", {}):
            required = schema.setdefault("required", [])
            if field not in required:
                required.append(field)
            options = schema["properties"][field].get("anyOf", [])
            options[:] = [o for o in options if o.get("type") != "null"]
    for name, schema in schemas.items():
        if name.endswith("Request"):
            for field, value in schema.get("properties", {}).items():
                if field in TOKEN_ID_FIELDS:
                    _bound_token_ids(value)
                if field in NON_EMPTY:
                    _non_empty(value)
                if field in NON_EMPTY_LIST:
                    for option in value.get("anyOf", [value]):
                        if option.get("type") == "array":
                            option["minItems"] = max(1, option.get("minItems", 0))


@schemathesis.hook
def before_load_schema(context: Any, raw_schema: dict[str, Any]) -> None:
    tighten(raw_schema)


@schemathesis.hook
def map_case(context: Any, case: Any) -> Any:
    # map_case, not map_body: schemathesis applies map_case in every phase (its coverage phase
    # builds cases without the body hooks).
    case.body = hostile(with_user_turn(case.operation.path, cap_body(case.operation.path, case.body)))
    return case


@schemathesis.serializer("application/json")
def json_with_lone_surrogates(ctx: Any, value: Any) -> bytes:
    """application/json bodies as ASCII JSON, fuzz.SURROGATE_MARKER as a lone surrogate (change 6);
    otherwise as schemathesis's own serializer sends them (raw bytes as given, None as null)."""
    if isinstance(value, bytes):
        return value
    if value is None:
        return b"null"
    try:
        return ascii_json(value)
    except TypeError:  # schemathesis's Binary inside a JSON body: the string it stands for
        return json.dumps(str(value)).encode()


def _json(content: bytes) -> Any:
    try:
        return json.loads(content)
    except (ValueError, UnicodeDecodeError):
        return None


@schemathesis.check
def json_error_body(ctx: Any, response: Any, case: Any) -> bool | None:
    if 400 <= response.status_code < 500:
        answer = _json(response.content)
        if not (isinstance(answer, dict) and ("error" in answer or "detail" in answer)):
            raise AssertionError(f"{response.status_code} without a JSON error body: {response.content[:200]!r}")
    return None


def _server_error(error: Any) -> bool:
    code = error.get("code") if isinstance(error, dict) else None
    return not (isinstance(code, int) and 400 <= code < 500)


@schemathesis.check
def no_error_event(ctx: Any, response: Any, case: Any) -> bool | None:
    content_type = response.headers.get("content-type", [""])
    content_type = content_type[0] if isinstance(content_type, list) else content_type
    if 200 <= response.status_code < 300 and "text/event-stream" in (content_type or ""):
        for line in response.content.decode("utf-8", "replace").splitlines():
            if line.startswith("data:"):
                event = _json(line[5:].strip().encode())
                if isinstance(event, dict) and "error" in event and _server_error(event["error"]):
                    raise AssertionError(f"server error event inside a {response.status_code} stream: {line[:300]}")
    return None
