"""json-whitespace on the target's own structured-output path: its `XgrammarBackend` (built by
its `__post_init__`, which the plugin wraps) compiling what its server hands it, with the xgrammar
of the target's lock (the vllm-ascend images carry xgrammar; so do both target venvs).

Three grammars, each as vLLM makes it: a `json_schema` response format, `json_object`, and a
forced tool call (`tool_choice=required` through the launcher's default parsers, the
`ParserManager` parser the chat server composes: its `adjust_request` turns the tools into the
structured-output request; key and compile as the engine does, `get_structured_output_key` ->
`compile_grammar`). Without the plugin each grammar allows whitespace without end where the
random model loops (vllm-project/vllm#38696); with it, at most json_whitespace.MAX_WHITESPACE in
a row. The forced call's schema: on 0.30's structural tag vLLM lets whitespace surround
an argument value (`" Paris\\r "` for an enum of `Paris`) and text follow a `required` call; the
plugin's tightened tag refuses both. 0.23 forces calls through the JSON-schema path, which holds
the schema itself. tests/test_json_whitespace.py shows the same on vLLM 0.32's grammars, and
tests/test_applications.py forced calls and JSON schemas ending on 0.32's server.
"""

from __future__ import annotations

import textwrap

from _target import results_each

PLUGIN_OFF = {"MINICPMV_ASCEND_PLUGIN": "off"}
LIMIT = 64  # more than this many whitespace characters in a row: "without end"

CODE = textwrap.dedent("""
    import json, sys
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from transformers import AutoTokenizer
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser.parser_manager import ParserManager
    from vllm.v1.structured_output.backend_types import StructuredOutputOptions
    from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend
    from vllm.v1.structured_output.request import get_structured_output_key
    from vllm.sampling_params import StructuredOutputsParams
    from minicpmv_ascend import settings

    checkpoint, limit = sys.argv[1], int(sys.argv[2])
    model_config = ModelConfig(model=checkpoint, tokenizer=checkpoint, dtype="bfloat16", max_model_len=4096)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    backend = XgrammarBackend(VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu")),
                              tokenizer=tokenizer,
                              vocab_size=model_config.get_vocab_size())

    def whitespace_accepted(key, prefix):
        matcher = backend.compile_grammar(*key).matcher
        assert matcher.accept_string(prefix), (key, prefix)
        count = 0
        while count < limit and matcher.accept_string("\\r"):
            count += 1
        return count

    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"]}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        "required": ["city"], "additionalProperties": False}}}]
    parser_cls = ParserManager.get_parser(tool_parser_name=settings.SETTINGS_BY_NAME["tool_call_parser"].default,
                                          reasoning_parser_name=settings.auto_reasoning_parser(), enable_auto_tools=True)

    def forced_key(choice):
        request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                        tools=tools, tool_choice=choice)
        request = parser_cls(tokenizer, request.tools).adjust_request(request)
        return get_structured_output_key(request.structured_outputs)

    def call(key, choice, value):
        # a structural tag: the call as the chat template writes it (value inside the template's
        # newlines); the JSON path: its array (required) or the arguments (a named function)
        if key[0] == StructuredOutputOptions.STRUCTURAL_TAG:
            return f"<tool_call>\\n<function=get_weather>\\n<parameter=city>\\n{value}\\n</parameter>\\n</function>\\n</tool_call>"
        arguments = json.dumps({"city": value})
        return f'[{{"name": "get_weather", "parameters": {arguments}}}]' if choice == "required" else arguments

    def schema_held(choice):
        key = forced_key(choice)
        held = {}
        for name, value, more in (("Paris", "Paris", ""), (" Paris\\\\r ", " Paris\\r ", ""),
                                  ("text after the call", "Paris", " Sure.")):
            matcher = backend.compile_grammar(*key).matcher
            held[name] = bool(matcher.accept_string(call(key, choice, value) + more)) and matcher.is_completed()
        return held

    forced = forced_key("required")
    out = {
        "json_schema": whitespace_accepted((StructuredOutputOptions.JSON, json.dumps(schema)), '{"answer"'),
        "json_object": whitespace_accepted(get_structured_output_key(StructuredOutputsParams(json_object=True)), "{"),
        "forced_call_kind": forced[0].name,
        # a structural tag: the call's opening as the chat template writes it; a JSON schema: its array
        "forced_call": whitespace_accepted(forced, "<tool_call>\\n<function=get_weather>\\n"
                                           if forced[0] == StructuredOutputOptions.STRUCTURAL_TAG else '[{"name"'),
        "backend_compiler": type(backend.compiler).__name__,
        "required": schema_held("required"),
        "named": schema_held({"type": "function", "function": {"name": "get_weather"}}),
    }
    print("RESULT " + json.dumps(out))
""")


# How the target's chat server constrains a forced call: 0.23 with the call's JSON schema
# (`get_json_schema_from_tools`); 0.30 with xgrammar's qwen_3_coder structural tag (its parser's
# `_apply_structural_tag`, VLLM_ENFORCE_STRICT_TOOL_CALLING on by default), whose json_schema part
# carries `max_whitespace_cnt: null`, as 0.32's does at --tool-strict-level parameter.
FORCED_CALL = {"0.23.0": "JSON", "0.30.0": "STRUCTURAL_TAG"}


def test_structured_output_whitespace_without_and_with_the_plugin(checkpoint, target):
    from minicpmv_ascend_plugin.patches.api import json_whitespace

    assert target.needs("json-whitespace"), "no target that bounds whitespace yet: add its expectations"
    code = CODE.replace("sys.argv[1], int(sys.argv[2])", f"{str(checkpoint)!r}, {LIMIT}")
    bug, fixed = results_each(code, PLUGIN_OFF, None)
    kind = FORCED_CALL[target.vllm]
    tag = kind == "STRUCTURAL_TAG"
    # the forced call's schema: on the structural tag (0.30) whitespace around a value and text after
    # a required call are vLLM's bug, the tightened tag refuses both; the JSON path (0.23) holds the
    # schema itself (a JSON string is the value, quotes included) and ends after its array
    spaced_bug = {"Paris": True, " Paris\\r ": tag, "text after the call": False}
    required_bug = {**spaced_bug, "text after the call": tag}
    held = {"Paris": True, " Paris\\r ": False, "text after the call": False}
    assert bug == {"json_schema": LIMIT, "json_object": LIMIT, "forced_call_kind": kind, "forced_call": LIMIT,
                   "backend_compiler": "GrammarCompiler", "required": required_bug, "named": spaced_bug}  # the bug
    bound = json_whitespace.MAX_WHITESPACE
    assert fixed == {"json_schema": bound, "json_object": bound, "forced_call_kind": kind,
                     # the tightened tag: before a parameter only the template's newline, no `\\r`
                     "forced_call": 0 if tag else bound,
                     "backend_compiler": "BoundedWhitespaceCompiler", "required": held, "named": held}
