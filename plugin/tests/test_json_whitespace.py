"""json-whitespace on the target's own structured-output path: its `XgrammarBackend` (built by
its `__post_init__`, which the plugin wraps) compiling what its server hands it, with the xgrammar
of the target's lock (the vllm-ascend images carry xgrammar; so do both target venvs).

Three grammars, each as vLLM makes it: a `json_schema` response format, `json_object`, and a
forced tool call (`tool_choice=required` through the launcher's default parsers, the
`ParserManager` parser the chat server composes: its `adjust_request` turns the tools into the
structured-output request; key and compile as the engine does, `get_structured_output_key` ->
`compile_grammar`). Without the plugin each grammar allows whitespace without end where the
random model loops (vllm-project/vllm#38696); with it, at most json_whitespace.MAX_WHITESPACE in
a row. tests/test_json_whitespace.py shows the same on vLLM 0.32's grammars, and
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
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                    tools=tools, tool_choice="required")
    parser_cls = ParserManager.get_parser(tool_parser_name=settings.SETTINGS_BY_NAME["tool_call_parser"].default,
                                          reasoning_parser_name=settings.auto_reasoning_parser(), enable_auto_tools=True)
    request = parser_cls(tokenizer, request.tools).adjust_request(request)
    forced = get_structured_output_key(request.structured_outputs)
    out = {
        "json_schema": whitespace_accepted((StructuredOutputOptions.JSON, json.dumps(schema)), '{"answer"'),
        "json_object": whitespace_accepted(get_structured_output_key(StructuredOutputsParams(json_object=True)), "{"),
        "forced_call_kind": forced[0].name,
        # a structural tag: the call's opening as the chat template writes it; a JSON schema: its array
        "forced_call": whitespace_accepted(forced, "<tool_call>\\n<function=get_weather>\\n"
                                           if forced[0] == StructuredOutputOptions.STRUCTURAL_TAG else '[{"name"'),
        "backend_compiler": type(backend.compiler).__name__,
    }
    print("RESULT " + json.dumps(out))
""")


# How the target's chat server constrains a forced call: 0.23 with the call's JSON schema
# (`get_json_schema_from_tools`); 0.30 with xgrammar's qwen_3_coder structural tag (its parser's
# `_apply_structural_tag`, VLLM_ENFORCE_STRICT_TOOL_CALLING on by default), whose json_schema part
# carries `max_whitespace_cnt: null`, as 0.32's does at --tool-strict-level parameter.
FORCED_CALL = {"0.23.0": "JSON", "0.30.0": "STRUCTURAL_TAG"}


def test_structured_output_whitespace_without_and_with_the_plugin(checkpoint, target):
    from minicpmv_ascend_plugin import json_whitespace

    assert target.needs("json-whitespace"), "no target that bounds whitespace yet: add its expectations"
    code = CODE.replace("sys.argv[1], int(sys.argv[2])", f"{str(checkpoint)!r}, {LIMIT}")
    bug, fixed = results_each(code, PLUGIN_OFF, None)
    kind = FORCED_CALL[target.vllm]
    assert bug == {"json_schema": LIMIT, "json_object": LIMIT, "forced_call_kind": kind, "forced_call": LIMIT,
                   "backend_compiler": "GrammarCompiler"}  # the bug: no end
    bound = json_whitespace.MAX_WHITESPACE
    assert fixed == {"json_schema": bound, "json_object": bound, "forced_call_kind": kind, "forced_call": bound,
                     "backend_compiler": "BoundedWhitespaceCompiler"}
