"""A Responses API content part that reaches vLLM's chat parser as a model object is parsed, not a 500.

Bug (vLLM 0.23, 0.30 and 0.32; found by `make fuzz` on 0.32): /v1/responses validates an input item such as
`{"type": "function_call_output", "id": "", "status": "completed", "output": [{"type":
"input_file", "detail": null}]}` into the openai package's pydantic output-item model, whose
`output` parts are pydantic objects, not dicts. vLLM's
`renderers/chat_utils.py::_parse_chat_message_content_mm_part` starts with
`assert isinstance(part, dict)` (a note says it is there for mypy): the AssertionError is
answered **500** with an empty message. No upstream fix in 0.32 / 0.33.

Fix: its caller `_parse_chat_message_content_part` (which reads `part.get("uuid")` too) is
wrapped: a part that is a pydantic object is turned into the dict it was sent as (`model_dump(exclude_none=True)`), which vLLM then parses like
any other part (an `input_file`, which vLLM does not support, is its usual 400 "Unsupported chat
content part type"); any other non-dict part is a ValueError (400) that says what a part must be.

Applies when: vLLM's `_parse_chat_message_content_mm_part` asserts that the part is a dict (read
from vLLM's source, without importing it; the test calls vLLM's own function with a pydantic part
and gets the AssertionError). Only the process that imports vLLM's chat parser (the API server) is
changed. Delete when: it accepts or refuses such a part with a 4xx error upstream.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from ._base import AT_REGISTER, Patch, function_source, module_name, source_of, wrap_once
from ._import_hook import when_imported

NAME = "content-part-400"
CHAT_UTILS = ("renderers/chat_utils.py", "entrypoints/chat_utils.py")  # 0.32, 0.23
FUNCTION = "_parse_chat_message_content_mm_part"  # asserts that the part is a dict
CALLER = "_parse_chat_message_content_part"  # wrapped: the parts reach FUNCTION through it


def _parse(original: Any) -> Any:
    @functools.wraps(original)
    def parse(part: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(part, (dict, str)):
            if hasattr(part, "model_dump"):
                part = part.model_dump(exclude_none=True)
            else:
                raise ValueError(f"a message content part must be a string or a JSON object with a `type`, "
                                 f"got {type(part).__name__}")
        return original(part, *args, **kwargs)

    return parse


def check(_: Any) -> str | None:
    found = function_source(FUNCTION, *CHAT_UTILS)
    path, body = found
    if not re.search(r"assert isinstance\(\s*part,\s*dict\s*\)", body):
        return f"vLLM's {path} {FUNCTION} does not assert that the part is a dict"
    return None


def apply(_: Any) -> None:
    path, _source = source_of(*CHAT_UTILS)
    when_imported(module_name(path), lambda module: wrap_once(module, CALLER, _parse))


# plugin/README.md's "Details and evidence" for this patch (Markdown; scripts/patch_table.py renders it).
DETAILS = r"""
wraps `_parse_chat_message_content_part` (vLLM's chat parser; 0.32
`renderers/chat_utils.py`, 0.23 and 0.30 `entrypoints/chat_utils.py`): a part that is a pydantic object is
dumped to the dict it was sent as (`exclude_none`), any other non-dict, non-string part is a
ValueError (400). Predicate: `_parse_chat_message_content_mm_part` asserts `isinstance(part,
dict)` in vLLM's source.
"""

PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary="a pydantic content part (Responses API output item) is parsed as the dict it was sent as; "
    "other non-dict parts are a 400, not an AssertionError 500",
    upstream="vllm/renderers/chat_utils.py _parse_chat_message_content_mm_part asserts isinstance(part, dict) (0.23-0.32)",
    check=check,
    apply=apply,
    fixes=('a /v1/responses content part that vLLM validated into an openai pydantic object (e.g. a `function_call_output` '
     'item with `id`, `status` and `[{"type": "input_file", "detail": null}]`) hits `assert isinstance(part, dict)`: '
     '**500** with an empty message (found by `make fuzz`)'),
    references='none found',
    tests=('`tests/test_fuzz_findings.py::test_content_part_400_bug_without_and_fix_with_the_plugin`, '
     "`plugin/tests/test_fuzz_findings.py` (each target's request model, chat parser and Responses converter); the "
     'server answers vLLM\'s 400 "Unsupported chat content part type"'),
    delete_when="vLLM's chat parser accepts (or refuses with a 4xx) a pydantic part",
    details=DETAILS,
    evidence={"0.30.0": ('applied', ('`entrypoints/chat_utils.py:1704`: `_parse_chat_message_content_mm_part` asserts '
                         '`isinstance(part, dict)` (0.30 has no `renderers/chat_utils.py`; the patch finds this '
                         'module)'))},
)
