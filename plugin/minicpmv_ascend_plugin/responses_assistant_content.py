"""An assistant message in a /v1/responses `input` with empty content or a refusal is served, not a 500.

Bug (vLLM 0.23, 0.30 and 0.32; found by `make fuzz` on 0.32): `entrypoints/openai/responses/utils.py::
_construct_message_from_response_item` turns an earlier assistant turn
(`{"type": "message", "role": "assistant", "content": [...]}`, an openai `ResponseOutputMessage`)
into a chat message with `item.content[0].text`. With `"content": []` that is an IndexError
("list index out of range"), and with a refusal part first (`{"type": "refusal", "refusal":
"..."}`, which the OpenAI API allows there) an AttributeError ("'ResponseOutputRefusal' object has
no attribute 'text'"): both are answered **500**. Both shapes are valid in the OpenAI schema, and
clients send them (Codex replays an assistant turn with empty content before a tool call).
Upstream: vllm-project/vllm PRs #48237 and #49130 (open; not in 0.32 / 0.33).

Fix: the function is wrapped: such an item is handed to vLLM with one `output_text` part whose text
is the refusal's text, or "" for empty content, which is what #49130 does. Every other item goes
to vLLM unchanged.

Applies when: vLLM's function reads `item.content[0].text` for a ResponseOutputMessage without
checking that the content has a text part (read from vLLM's source, without importing it). Only
the process that imports vLLM's Responses API code (the API server) is changed.
Delete when: vLLM checks the content there (or joins the text and refusal parts).
"""

from __future__ import annotations

import functools
from typing import Any

from ._base import AT_REGISTER, Patch, function_source, module_name, source_of, wrap_once
from ._import_hook import when_imported

NAME = "responses-assistant-content"
UTILS = ("entrypoints/openai/responses/utils.py",)  # 0.32 (0.23 has no such function: see check)
FUNCTION = "_construct_message_from_response_item"


def text_item(item: Any) -> Any:
    """`item` with one output_text part: the first part's text, else its refusal, else ""."""
    from openai.types.responses import ResponseOutputText

    content = list(getattr(item, "content", None) or [])
    first = content[0] if content else None
    if isinstance(getattr(first, "text", None), str):
        return item
    text = getattr(first, "refusal", None) or ""
    return item.model_copy(update={"content": [ResponseOutputText(type="output_text", text=text, annotations=[])]})


def _construct(original: Any) -> Any:
    @functools.wraps(original)
    def construct(item: Any, *args: Any, **kwargs: Any) -> Any:
        if type(item).__name__ == "ResponseOutputMessage":
            item = text_item(item)
        return original(item, *args, **kwargs)

    return construct


def check(_: Any) -> str | None:
    found = function_source(FUNCTION, *UTILS)
    path, body = found
    if "item.content[0].text" not in body:
        return f"vLLM's {path} {FUNCTION} does not read item.content[0].text"
    return None


def apply(_: Any) -> None:
    path, _source = source_of(*UTILS)
    when_imported(module_name(path), lambda module: wrap_once(module, FUNCTION, _construct))


# plugin/README.md's "Details and evidence" for this patch (Markdown; scripts/patch_table.py renders it).
DETAILS = r"""
wraps `_construct_message_from_response_item`
(`entrypoints/openai/responses/utils.py`, 0.23, 0.30 and 0.32): an assistant `ResponseOutputMessage`
whose first part has no text is handed on with one `output_text` part: the refusal's text, or ""
for empty content (what upstream PR #49130 does). Predicate: that function reads
`item.content[0].text` in vLLM's source.
"""

PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary="an assistant message in /v1/responses input with empty content or a refusal first is served "
    "(its text: the refusal, or empty), not a 500 (IndexError / AttributeError)",
    upstream="vllm/entrypoints/openai/responses/utils.py _construct_message_from_response_item reads "
    "item.content[0].text unchecked (0.23-0.32)",
    check=check,
    apply=apply,
    fixes=('an assistant turn in /v1/responses `input` with `"content": []` or a refusal part first: **500** (IndexError / '
     'AttributeError on `item.content[0].text`) (found by `make fuzz`)'),
    references='vLLM PRs #48237, #49130 (open)',
    tests=('`tests/test_fuzz_findings.py::test_responses_assistant_content_bug_without_and_fix_with_the_plugin`, '
     "`plugin/tests/test_fuzz_findings.py` (each target's request model, chat parser and Responses converter); the "
     'server answers 200'),
    delete_when='vLLM guards `item.content[0].text`',
    details=DETAILS,
    evidence={"0.30.0": ('applied', ('`entrypoints/openai/responses/utils.py:225`, `:282`, `:302`: '
                         '`_construct_message_from_response_item` reads `item.content[0].text` unchecked'))},
)
