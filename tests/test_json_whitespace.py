"""The plugin's json-whitespace patch, on vLLM 0.32's own grammars and the installed xgrammar.

What the grammar lets through: vLLM builds a forced call's grammar (`tool_choice` required or
named, the qwen3_coder format) as an xgrammar structural tag whose JSON-schema part has
`max_whitespace_cnt: null`, and compiles JSON schemas without a bound: `[ \\n\\r\\t]*` between any
two tokens, without end. That is where the random model loops (token 219, `\\r`, until max_tokens;
vllm-project/vllm#38696). With the patch's compiler the ninth whitespace character in a row is
refused, so the matcher forces the next structural token. The same wrapper tightens the forced
call's tag: no whitespace around an argument value (vLLM's grammar let `" Paris\\r "`
through for an enum of `Paris`), every rule of the tool's schema held, and a `required` call may end
the answer. The server-level proof (forced calls and JSON schemas that end with random weights, 56
forced answers within their schema): tests/test_applications.py.
"""

from __future__ import annotations

import json

import pytest

from minicpmv_ascend_plugin.patches.api import json_whitespace

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


def forced_call_tag(tools: list | None = None, choice: object = "required") -> str:
    """The structural tag vLLM 0.32 builds for a forced call (`required` or a named function) at
    --tool-strict-level parameter."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag
    from vllm.tool_parsers.tool_strict_level import ToolStrictLevel

    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], tools=tools or TOOLS,
                                    tool_choice=choice)
    tag = get_model_structural_tag("qwen_3_coder", request.tools, request.tool_choice, reasoning=False,
                                   strict_level=ToolStrictLevel.PARAMETER)
    return json.dumps(tag.model_dump())


def test_forced_tool_call_whitespace_is_endless_in_vllm_and_bounded_with_the_patch(compilers):
    vllm_compiler, patched = compilers
    tag = forced_call_tag()
    assert '"max_whitespace_cnt": null' in tag  # vLLM leaves the bound out
    prefix = "<tool_call>\n<function=get_weather>\n"
    assert whitespace_accepted(vllm_compiler.compile_structural_tag(tag), prefix) == 64  # no end
    # with the patch the tool-call tag is tightened too: before a parameter at most the template's
    # one newline, no `\r` at all (its JSON values keep the bound: test_forced_call_grammar_...)
    assert whitespace_accepted(patched.compile_structural_tag(tag), prefix) == 0
    bounded_only = json_whitespace.bound_structural_tag(tag)  # the bound alone, as before the tightening
    assert whitespace_accepted(vllm_compiler.compile_structural_tag(bounded_only), prefix) == json_whitespace.MAX_WHITESPACE


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


# A schema with what a tool's parameters hold: an enum string, a bounded integer, a const, a pattern,
# a nested object with its own enum, an array of integers, no additional properties.
RICH = {"type": "object", "additionalProperties": False, "required": ["city", "days"], "properties": {
    "city": {"type": "string", "enum": ["Paris", "Rome"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "kind": {"const": "forecast"},
    "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
    "where": {"type": "object", "properties": {"unit": {"type": "string", "enum": ["m", "km"]}},
              "required": ["unit"], "additionalProperties": False},
    "hours": {"type": "array", "items": {"type": "integer"}}}}
RICH_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": RICH}},
              {"type": "function", "function": {"name": "get_time", "parameters": {
                  "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
                  "required": ["zone"], "additionalProperties": False}}}]
CALL = "<tool_call>\n<function=get_weather>\n{}\n</function>\n</tool_call>"


def parameters(**values: str) -> str:
    """The arguments as the chat template writes them (values given with their surroundings)."""
    return "\n".join(f"<parameter={k}>{v}</parameter>" for k, v in values.items())


def accepts(grammar, text: str) -> bool:
    import xgrammar as xgr

    return bool(xgr.GrammarMatcher(grammar).accept_string(text))


def complete(grammar, text: str) -> bool:
    """The whole text is accepted and the answer may end there."""
    import xgrammar as xgr

    matcher = xgr.GrammarMatcher(grammar)
    return bool(matcher.accept_string(text)) and matcher.is_completed()


GOOD = parameters(city="\nParis\n", days="\n3\n", kind="\nforecast\n", code="\nCDG\n",
                  where='\n{"unit": "km"}\n', hours="\n[1, 2]\n")
BAD = {  # what the random model wrote, or what the schema forbids: each breaks the tool's schema
    "whitespace around an enum value": parameters(city="\n Paris\r \n", days="\n3\n"),
    "whitespace inside the newlines": parameters(city=" Paris\r ", days="\n3\n"),
    "enum in the nested object": parameters(city="\nParis\n", days="\n3\n", where='\n{"unit": "km "}\n'),
    "integer out of range": parameters(city="\nParis\n", days="\n8\n"),
    "const": parameters(city="\nParis\n", days="\n3\n", kind="\nhindcast\n"),
    "pattern": parameters(city="\nParis\n", days="\n3\n", code="\ncdg\n"),
    "required missing": parameters(city="\nParis\n"),
    "additional property": parameters(city="\nParis\n", days="\n3\n", extra="\nx\n"),
    "array item type": parameters(city="\nParis\n", days="\n3\n", hours='\n["1"]\n'),
}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_forced_call_grammar_holds_the_tools_schema_with_the_patch(compilers, choice):
    """vLLM 0.32's forced-call tag lets whitespace surround a value (the parser strips one newline
    each side, so `" Paris\\r "` reached clients); with the patch a call is accepted only with
    values of the schema, and each of BAD is refused. The schema's other rules hold with and without."""
    vllm_compiler, patched = compilers
    tag = forced_call_tag(RICH_TOOLS, choice)
    bug, fixed = vllm_compiler.compile_structural_tag(tag), patched.compile_structural_tag(tag)
    assert complete(fixed, CALL.format(GOOD)) and complete(bug, CALL.format(GOOD))
    assert complete(bug, CALL.format(BAD["whitespace around an enum value"]))  # the bug
    refused = {name: not accepts(fixed, CALL.format(text)) for name, text in BAD.items()}
    assert refused == dict.fromkeys(BAD, True)


def test_a_required_call_may_end_after_the_call_with_the_patch(compilers):
    """`tool_choice=required` is a triggered-tags grammar: after the call any text until max_tokens
    (what the random model wrote). With the patch the answer ends after the call or another call
    follows (parallel calls), nothing else."""
    vllm_compiler, patched = compilers
    tag = forced_call_tag(RICH_TOOLS, "required")
    bug, fixed = vllm_compiler.compile_structural_tag(tag), patched.compile_structural_tag(tag)
    call = CALL.format(GOOD)
    second = "<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>"
    assert accepts(bug, call + " and some text")  # the bug
    assert not accepts(fixed, call + " ") and not accepts(fixed, call + "Sure")
    assert complete(fixed, call) and complete(fixed, call + "\n" + second)
    one = forced_call_tag(RICH_TOOLS, "required").replace('"stop_after_first": false', '"stop_after_first": true')
    assert not accepts(patched.compile_structural_tag(one), call + "\n")  # parallel_tool_calls=false: one call


def test_a_clients_own_structural_tag_is_left_as_it_is():
    """Only the qwen_3_coder tool-call tag is tightened: a client's structural tag with other
    begin/end strings compiles as vLLM sends it."""
    tag = {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<f="], "at_least_one": True,
           "tags": [{"type": "tag", "begin": "<f=a>", "end": "</f>", "content": {
               "type": "json_schema", "json_schema": RICH, "style": "qwen_xml"}}]}}
    assert json_whitespace.tighten_tool_calls(json.dumps(tag)) == json.dumps(tag)
