"""The fuzzer's 500s (request-type-400, content-part-400, responses-assistant-content) on the
target's own code: the same bugs are there, and the same patches fix them.

Found by `make fuzz` on vLLM 0.32 (docs/reliability.md); tests/test_fuzz_findings.py shows them on
0.32 and through the real server. Here the target's request model (through FastAPI's body field),
chat parser and Responses API converter are called directly, with the plugin and with
MINICPMV_ASCEND_PLUGIN=off (the bug).
"""

from __future__ import annotations

import textwrap

from _target import results_each

PLUGIN_OFF = {"MINICPMV_ASCEND_PLUGIN": "off"}

CODE = textwrap.dedent("""
    import importlib, json, types
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from fastapi._compat.v2 import ModelField
    from pydantic.fields import FieldInfo
    from openai.types.responses import ResponseInputText, ResponseOutputMessage, ResponseOutputRefusal
    from minicpmv_ascend_plugin.patches.api import content_part_400
    from minicpmv_ascend_plugin.core.vllm_code import module_name, source_of
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.openai.responses import utils
    chat_utils = importlib.import_module(module_name(source_of(*content_part_400.CHAT_UTILS)[0]))

    def outcome(call):
        try:
            return ["ok", repr(call())[:200]]
        except Exception as error:
            return [type(error).__name__, str(error)[:200]]

    field = ModelField(field_info=FieldInfo(annotation=CompletionRequest), name="request")  # FastAPI's body field
    parser = types.SimpleNamespace(model_config=types.SimpleNamespace(enable_prompt_embeds=False))
    assistant = lambda *content: ResponseOutputMessage(id="m", type="message", role="assistant", status="completed",
                                                       content=list(content))
    out = {
        "structured_outputs": outcome(lambda: field.validate({"prompt": "x", "structured_outputs": []}, {}, loc=("body",))),
        "pydantic_part": outcome(lambda: chat_utils._parse_chat_message_content_part(
            ResponseInputText(type="input_text", text="x"), parser, wrap_dicts=False, interleave_strings=False)),
        "empty_assistant": outcome(lambda: utils._construct_message_from_response_item(assistant(), None)),
        "refusal_assistant": outcome(lambda: utils._construct_message_from_response_item(
            assistant(ResponseOutputRefusal(type="refusal", refusal="no")), None)),
    }
    print("RESULT " + json.dumps(out))
""")


def test_the_fuzzers_500s_without_and_with_the_plugin(target):
    for patch in ("request-type-400", "content-part-400", "responses-assistant-content"):
        assert target.needs(patch), f"{patch} not needed on {target.name}: add its expectations"
    bug, fixed = results_each(CODE, PLUGIN_OFF, None)
    assert bug["structured_outputs"] == ["AttributeError", "'list' object has no attribute 'get'"]
    assert bug["pydantic_part"][0] == "AssertionError"
    assert bug["empty_assistant"] == ["IndexError", "list index out of range"]
    assert bug["refusal_assistant"][0] == "AttributeError"
    # with the plugin: a validation error naming the field; the part parsed; the assistant turns served
    assert fixed["structured_outputs"][0] == "ok" and "`structured_outputs` must be a JSON object" in fixed["structured_outputs"][1]
    assert fixed["pydantic_part"] == ["ok", "'x'"]
    assert fixed["empty_assistant"] == ["ok", repr({"role": "assistant", "content": ""})]
    assert fixed["refusal_assistant"] == ["ok", repr({"role": "assistant", "content": "no"})]
