"""A Responses API content part that reaches vLLM's chat parser as a model object is parsed, not a 500."""

from __future__ import annotations

import functools
import re
from typing import Any

from ...core.patch import AT_REGISTER, Patch
from ...core.vllm_code import function_source
from ...core.wrap import wrap_when_imported

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
    path, body = function_source(FUNCTION, *CHAT_UTILS)
    if not re.search(r"assert isinstance\(\s*part,\s*dict\s*\)", body):
        return f"vLLM's {path} {FUNCTION} does not assert that the part is a dict"
    return None


def apply(_: Any) -> None:
    wrap_when_imported(CHAT_UTILS, CALLER, _parse)


PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary="a pydantic content part (Responses API output item) is parsed as the dict it was sent as; "
    "other non-dict parts are a 400, not an AssertionError 500",
    upstream=f"none found; vllm/{CHAT_UTILS[0]} {FUNCTION} asserts isinstance(part, dict) (0.23-0.32)",
    check=check,
    apply=apply,
    fixes=('a /v1/responses content part that vLLM validated into an openai pydantic object (e.g. a `function_call_output` '
     'item with `id`, `status` and `[{"type": "input_file", "detail": null}]`) hits `assert isinstance(part, dict)`: '
     '**500** with an empty message (found by `make fuzz`)'),
    tests=('`tests/test_fuzz_findings.py::test_content_part_400_bug_without_and_fix_with_the_plugin`, '
     "`plugin/tests/patches/api/test_target_fuzz_findings.py` (each target's request model, chat parser and Responses converter); the "
     'server answers vLLM\'s 400 "Unsupported chat content part type"'),
    delete_when="vLLM's chat parser accepts (or refuses with a 4xx) a pydantic part",
    details=f"""
/v1/responses validates an input item such as `{{"type": "function_call_output", "id": "", "status":
"completed", "output": [{{"type": "input_file", "detail": null}}]}}` into the openai package's
pydantic output-item model, whose `output` parts are pydantic objects, not dicts; vLLM's
`{FUNCTION}` starts with `assert isinstance(part, dict)` (a note says it is there for mypy), and
the AssertionError is answered 500 with an empty message. The patch wraps its caller `{CALLER}`
(vLLM's chat parser; 0.32 `{CHAT_UTILS[0]}`, 0.23 and 0.30 `{CHAT_UTILS[1]}`; it reads
`part.get("uuid")` too): a part that is a pydantic object is dumped to the dict it was sent as
(`exclude_none`), which vLLM then parses like any other part (an `input_file` is its usual 400
"Unsupported chat content part type"); any other non-dict, non-string part is a ValueError (400).
Only the process that imports vLLM's chat parser (the API server) is changed. Predicate: `{FUNCTION}`
asserts `isinstance(part, dict)` in vLLM's source.
""",
    evidence={"0.30.0": ('applied', (f'`{CHAT_UTILS[1]}:1704`: `{FUNCTION}` asserts `isinstance(part, dict)` (0.30 has '
                                     f'no `{CHAT_UTILS[0]}`; the patch finds this module)'))},
)
