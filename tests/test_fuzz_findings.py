"""Regression tests for the 5xx answers the API fuzzer found (docs/reliability.md, "Fuzzing").

Each finding: the bug shown on vLLM 0.32's own code with the plugin off, gone with it on (no
server: every scenario below runs in one subprocess with the plugin on and one with it off, two
vLLM imports in all), and the real server answering the request that the fuzzer sent.
The one-token engine crash, the decompression-bomb image and the shutdown-drain 500s are fixed
and tested elsewhere (plugin gdn-one-token-prefill and its tests).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from support import raw_http
from support.server import REPO, clean_env

PLUGIN_OFF = {"MINICPMV_ASCEND_PLUGIN": "off"}

# What the fuzzer sent (minimised by hand from its report), and what must come back now: a 400
# with a word of its message, or (None) a 200 answer.
FINDINGS = {
    "structured_outputs_list": ("/v1/completions", {"prompt": "Hello", "max_tokens": 2, "structured_outputs": [None, None]},
                                "`structured_outputs` must be a JSON object"),
    "structured_outputs_string_chat": ("/v1/chat/completions",
                                       {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                                        "structured_outputs": "x"}, "`structured_outputs` must be a JSON object"),
    "structured_outputs_list_invocations": ("/invocations",
                                            {"prompt": "Hello", "max_tokens": 2, "structured_outputs": []},
                                            "Cannot find suitable handler for request"),
    "responses_output_item_part": ("/v1/responses",
                                   {"input": [{"id": "", "type": "function_call_output", "status": "completed",
                                               "output": [{"type": "input_file", "detail": None}]}],
                                    "max_output_tokens": 2}, "Unsupported chat content part type: 'input_file'"),
    # With a user turn after it: the model's chat template refuses a conversation without one (400
    # "No user query found in messages."), after vLLM has read the assistant message (the bug).
    "responses_assistant_empty_content": ("/v1/responses",
                                          {"input": [{"type": "message", "role": "assistant", "content": [],
                                                      "id": "", "status": "completed"},
                                                     {"role": "user", "content": "Hi"}], "max_output_tokens": 2},
                                          None),
    "responses_no_user_turn": ("/v1/responses",
                               {"input": [{"type": "message", "role": "assistant", "content": [],
                                           "id": "", "status": "completed"}], "max_output_tokens": 2},
                               "No user query found in messages"),
    "responses_assistant_refusal": ("/v1/responses",
                                    {"input": [{"type": "message", "role": "assistant",
                                                "content": [{"type": "refusal", "refusal": "no"}]},
                                               {"role": "user", "content": "Hi"}], "max_output_tokens": 2},
                                    None),
}


def run_python(code: str, env: dict[str, str] | None = None) -> dict:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=clean_env(**(env or {})))
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


# Runs each scenario's code (CODES: name -> code, prepended by the fixture) in this one process, each
# with globals of its own; a scenario's `print("RESULT ...")` is its result.
SCENARIOS_RUNNER = textwrap.dedent("""
    import json
    out = {}
    for name, code in CODES.items():
        printed = []
        exec(code, {"__name__": "scenario_" + name, "print": printed.append})
        out[name] = json.loads(printed[-1].removeprefix("RESULT "))
    print("RESULT " + json.dumps(out))
""")


# The tests that read it run on one pytest-xdist worker, so that its two processes run once.
SCENARIOS_GROUP = pytest.mark.xdist_group("fuzz-findings-scenarios")


@pytest.fixture(scope="module")
def scenarios() -> dict[str, dict]:
    """Every scenario's result with the plugin ("fixed") and without it ("bug")."""
    codes = {"validation": VALIDATION, "invocations": INVOCATIONS, "content_part": CONTENT_PART,
             "responses_input": RESPONSES_INPUT}
    runner = f"CODES = {codes!r}\n" + SCENARIOS_RUNNER
    return {"fixed": run_python(runner), "bug": run_python(runner, PLUGIN_OFF)}


def fixed_and_bug(scenarios: dict[str, dict], name: str) -> tuple[dict, dict]:
    return scenarios["fixed"][name], scenarios["bug"][name]


VALIDATION = textwrap.dedent("""
    import json, types
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.serve.exception_handling.register import init_exception_handler

    app = FastAPI()
    init_exception_handler(app)  # vLLM's own error mapping
    app.state.args = types.SimpleNamespace(log_error_stack=False)  # what its handlers read

    @app.post("/v1/completions")
    async def create(request: CompletionRequest):
        return {"ok": True}

    client = TestClient(app, raise_server_exceptions=False)
    out = {}
    for name, value in (("list", [None, None]), ("string", "x"), ("object", {"regex": "[0-9]+"})):
        answer = client.post("/v1/completions", json={"prompt": "x", "structured_outputs": value})
        out[name] = [answer.status_code, answer.text[:400]]
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.slow
@SCENARIOS_GROUP
def test_request_type_400_bug_without_and_fix_with_the_plugin(scenarios):
    fixed, bug = fixed_and_bug(scenarios, "validation")
    assert bug["list"][0] == bug["string"][0] == 500  # the bug (the real server says "'list' object has no attribute 'get'")
    for name in ("list", "string"):
        status, text = fixed[name]
        assert status == 400 and "`structured_outputs` must be a JSON object" in text, fixed[name]
    assert fixed["object"] == bug["object"] == [200, '{"ok":true}']  # a valid body is untouched


INVOCATIONS = textwrap.dedent("""
    import json
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from vllm.entrypoints.serve.sagemaker import api_router  # /invocations builds its TypeAdapters from it
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    adapter = api_router.pydantic.TypeAdapter(CompletionRequest)
    out = {}
    for name, body in (("list", {"prompt": "x", "structured_outputs": []}), ("ok", {"prompt": "x"})):
        try:
            out[name] = ["ok", adapter.validate_python(body).prompt]
        except Exception as error:
            out[name] = [type(error).__name__, str(error)[:300]]
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.slow
@SCENARIOS_GROUP
def test_request_type_400_covers_invocations(scenarios):
    """/invocations catches only ValidationError from its TypeAdapters: the bug is a 500 there too."""
    fixed, bug = fixed_and_bug(scenarios, "invocations")
    assert bug["list"][0] == "AttributeError"  # escapes /invocations' `except pydantic.ValidationError`
    assert fixed["list"][0] == "ValidationError" and "`structured_outputs` must be a JSON object" in fixed["list"][1]
    assert fixed["ok"] == bug["ok"] == ["ok", "x"]


CONTENT_PART = textwrap.dedent("""
    import json, types
    from openai.types.responses import ResponseInputFile, ResponseInputText
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
    from vllm.renderers import chat_utils

    # what the text path reads from the parser (no media here)
    parser = types.SimpleNamespace(model_config=types.SimpleNamespace(enable_prompt_embeds=False))
    out = {}
    for name, part in (("text", ResponseInputText(type="input_text", text="x")),
                       ("file", ResponseInputFile(type="input_file")), ("number", 7),
                       ("dict", {"type": "input_text", "text": "x"}), ("file_dict", {"type": "input_file"})):
        try:
            out[name] = ["ok", chat_utils._parse_chat_message_content_part(
                part, parser, wrap_dicts=False, interleave_strings=False)]
        except Exception as error:
            out[name] = [type(error).__name__, str(error)[:200], create_error_response(error).error.code]
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.slow
@SCENARIOS_GROUP
def test_content_part_400_bug_without_and_fix_with_the_plugin(scenarios):
    fixed, bug = fixed_and_bug(scenarios, "content_part")
    assert bug["text"][0] == bug["file"][0] == "AssertionError" and bug["file"][2] == 500  # the bug
    assert fixed["text"] == fixed["dict"] == bug["dict"] == ["ok", "x"]
    # parsed like the dict it was sent as: vLLM's own 400 for a part type it does not support
    assert fixed["file"] == fixed["file_dict"] == bug["file_dict"]
    assert fixed["file"][0::2] == ["VLLMValidationError", 400] and "Unsupported chat content part type" in fixed["file"][1]
    assert fixed["number"][0::2] == ["ValueError", 400] and "must be a string or a JSON object" in fixed["number"][1]


RESPONSES_INPUT = textwrap.dedent("""
    import json
    from openai.types.responses import ResponseOutputMessage, ResponseOutputRefusal, ResponseOutputText
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
    from vllm.entrypoints.openai.responses import utils

    def message(*content):
        return ResponseOutputMessage(id="m", type="message", role="assistant", status="completed", content=list(content))

    out = {}
    for name, item in (("empty", message()), ("refusal", message(ResponseOutputRefusal(type="refusal", refusal="no"))),
                       ("text", message(ResponseOutputText(type="output_text", text="yes", annotations=[])))):
        try:
            out[name] = ["ok", utils._construct_message_from_response_item(item, None)]
        except Exception as error:
            out[name] = [type(error).__name__, str(error)[:300], create_error_response(error).error.code]
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.slow
@SCENARIOS_GROUP
def test_responses_assistant_content_bug_without_and_fix_with_the_plugin(scenarios):
    fixed, bug = fixed_and_bug(scenarios, "responses_input")
    assert bug["empty"][0::2] == ["IndexError", 500] and bug["refusal"][0::2] == ["AttributeError", 500]  # the bug
    # served like upstream PR #49130: the refusal's text, or "" for empty content
    assert fixed["empty"] == ["ok", {"role": "assistant", "content": ""}]
    assert fixed["refusal"] == ["ok", {"role": "assistant", "content": "no"}]
    assert fixed["text"] == bug["text"] == ["ok", {"role": "assistant", "content": "yes"}]


def test_plugin_predicates_read_vllm_032():
    out = run_python(textwrap.dedent("""
        import json
        from minicpmv_ascend_plugin.patches.api import content_part_400
        from minicpmv_ascend_plugin.patches.api import request_type_400
        from minicpmv_ascend_plugin.patches.api import responses_assistant_content
        print("RESULT " + json.dumps([p.check(None) for p in (request_type_400, content_part_400, responses_assistant_content)]))
    """))
    assert out == [None, None, None]  # the three bugs are in vLLM 0.32's source


@pytest.mark.server
@pytest.mark.parametrize("name", sorted(FINDINGS))
def test_the_fuzzers_request_is_answered_on_the_server(server, name):
    path, body, says = FINDINGS[name]
    status, answer = raw_http.send(server.base_url + path, {"model": server.model, **body}, timeout=60)
    if says is None:
        assert status == 200 and json.loads(answer)["object"] == "response", answer[:500]
    else:
        assert status == 400, answer[:500]
        assert says in json.loads(answer)["error"]["message"], answer[:500]
    assert raw_http.healthy(server.base_url)
