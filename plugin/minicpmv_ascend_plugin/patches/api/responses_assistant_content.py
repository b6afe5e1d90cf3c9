"""An assistant message in a /v1/responses `input` with empty content or a refusal is served, not a 500."""

from __future__ import annotations

import functools
from typing import Any

from ...core.patch import AT_REGISTER, Patch
from ...core.vllm_code import function_source
from ...core.wrap import wrap_when_imported

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
    path, body = function_source(FUNCTION, *UTILS)
    if "item.content[0].text" not in body:
        return f"vLLM's {path} {FUNCTION} does not read item.content[0].text"
    return None


def apply(_: Any) -> None:
    wrap_when_imported(UTILS, FUNCTION, _construct)


PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary="an assistant message in /v1/responses input with empty content or a refusal first is served "
    "(its text: the refusal, or empty), not a 500 (IndexError / AttributeError)",
    upstream=f"vLLM PRs #48237, #49130 (open); vllm/{UTILS[0]} {FUNCTION} reads item.content[0].text unchecked "
             "(0.23-0.32)",
    check=check,
    apply=apply,
    fixes=('an assistant turn in /v1/responses `input` with `"content": []` or a refusal part first: **500** (IndexError / '
     'AttributeError on `item.content[0].text`) (found by `make fuzz`)'),
    tests=('`tests/test_fuzz_findings.py::test_responses_assistant_content_bug_without_and_fix_with_the_plugin`, '
     "`plugin/tests/patches/api/test_target_fuzz_findings.py` (each target's request model, chat parser and Responses converter); the "
     'server answers 200'),
    delete_when='vLLM guards `item.content[0].text`',
    details=f"""
`{FUNCTION}` (`{UTILS[0]}`, 0.23, 0.30 and 0.32) turns an earlier assistant turn (an openai
`ResponseOutputMessage`) into a chat message with `item.content[0].text`: with `"content": []` that
is an IndexError, with a refusal part first (`{{"type": "refusal", ...}}`, which the OpenAI API allows
there) an AttributeError, both answered 500; clients send both shapes (Codex replays an assistant
turn with empty content before a tool call). The patch wraps it: an assistant
`ResponseOutputMessage` whose first part has no text is handed on with one `output_text` part, the
refusal's text or "" for empty content (what upstream PR #49130 does); every other item is
unchanged, and only the process that imports vLLM's Responses API code (the API server) is
changed. Predicate: that function reads `item.content[0].text` in vLLM's source.
""",
    evidence={"0.30.0": ('applied', (f'`{UTILS[0]}:225`, `:282`, `:302`: `{FUNCTION}` reads `item.content[0].text` '
                                     'unchecked'))},
)
