"""The plugin's json-whitespace patch, on vLLM 0.32's own grammars and the installed xgrammar.

What the grammar lets through: vLLM builds a forced call's grammar (`tool_choice` required or
named, the qwen3_coder format) as an xgrammar structural tag whose JSON-schema part has
`max_whitespace_cnt: null`, and compiles JSON schemas without a bound: `[ \\n\\r\\t]*` between any
two tokens, without end. That is where the random model loops (token 219, `\\r`, until max_tokens;
vllm-project/vllm#38696). With the patch's compiler the ninth whitespace character in a row is
refused, so the matcher forces the next structural token. The server-level proof (forced calls and
JSON schemas that end with random weights): tests/test_applications.py.
"""

from __future__ import annotations

import json

import pytest

from minicpmv_ascend_plugin import json_whitespace

PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Beijing"]}},
              "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}]


@pytest.fixture(scope="module")
def compilers(tiny_config):
    import xgrammar as xgr
    from transformers import AutoTokenizer

    info = xgr.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(tiny_config))
    vllm_compiler = xgr.GrammarCompiler(info)
    return vllm_compiler, json_whitespace.BoundedWhitespaceCompiler(xgr.GrammarCompiler(info))


def whitespace_accepted(grammar, prefix: str, limit: int = 64) -> int:
    """How many `\\r` in a row the grammar accepts after `prefix`."""
    import xgrammar as xgr

    matcher = xgr.GrammarMatcher(grammar)
    assert matcher.accept_string(prefix)
    count = 0
    while count < limit and matcher.accept_string("\r"):
        count += 1
    return count


def forced_call_tag() -> str:
    """The structural tag vLLM 0.32 builds for `tool_choice=required` at --tool-strict-level parameter."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag
    from vllm.tool_parsers.tool_strict_level import ToolStrictLevel

    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], tools=TOOLS,
                                    tool_choice="required")
    tag = get_model_structural_tag("qwen_3_coder", request.tools, request.tool_choice, reasoning=False,
                                   strict_level=ToolStrictLevel.PARAMETER)
    return json.dumps(tag.model_dump())


def test_forced_tool_call_whitespace_is_endless_in_vllm_and_bounded_with_the_patch(compilers):
    vllm_compiler, patched = compilers
    tag = forced_call_tag()
    assert '"max_whitespace_cnt": null' in tag  # vLLM leaves the bound out
    prefix = "<tool_call>\n<function=get_weather>\n"
    assert whitespace_accepted(vllm_compiler.compile_structural_tag(tag), prefix) == 64  # no end
    assert whitespace_accepted(patched.compile_structural_tag(tag), prefix) == json_whitespace.MAX_WHITESPACE


def test_json_schema_whitespace_is_endless_in_vllm_and_bounded_with_the_patch(compilers):
    vllm_compiler, patched = compilers
    schema = json.dumps({"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"]})
    # vLLM's xgrammar backend calls it exactly so (disable_any_whitespace false, the default).
    endless = vllm_compiler.compile_json_schema(schema, any_whitespace=True, separators=None)
    bounded = patched.compile_json_schema(schema, any_whitespace=True, separators=None)
    assert whitespace_accepted(endless, '{"answer"') == 64
    assert whitespace_accepted(bounded, '{"answer"') == json_whitespace.MAX_WHITESPACE
    compact = patched.compile_json_schema(schema, any_whitespace=False, separators=(",", ":"))
    assert whitespace_accepted(compact, '{"answer"') == 0  # disable_any_whitespace is left as it is


def test_the_patch_applies_to_this_vllm_and_is_a_wrapper_of_vllms_backend():
    from vllm.v1.structured_output import backend_xgrammar

    assert json_whitespace.check(None) is None
    source = (backend_xgrammar.__file__ and open(backend_xgrammar.__file__, encoding="utf-8").read())
    assert "self.compiler.compile_structural_tag(grammar_spec)" in source  # the call the wrapper bounds
