"""Drive a vLLM reasoning parser over model outputs the way vLLM's chat server does: the whole
text at once (`extract_reasoning`) and token by token (`extract_reasoning_streaming`).

Shared by plugin/tests (vLLM 0.23) and tests/test_plugin.py (vLLM 0.32); the expected results in
reasoning_cases.json are vLLM 0.32's own `minicpmv` parser's (checked by tests/test_plugin.py).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

CASES = pathlib.Path(__file__).with_name("reasoning_cases.json")


def load_cases() -> list[dict[str, Any]]:
    return json.loads(CASES.read_text(encoding="utf-8"))


def run(parser_cls: Any, tokenizer: Any, thinking: bool, output: str) -> dict[str, Any]:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    kwargs = {"chat_template_kwargs": {"enable_thinking": thinking}}
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **kwargs)
    reasoning, content = parser_cls(tokenizer, **kwargs).extract_reasoning(output, request)

    parser = parser_cls(tokenizer, **kwargs)
    ids = tokenizer.encode(output, add_special_tokens=False)
    previous_text, previous_ids, streamed = "", [], {"reasoning": "", "content": ""}
    for i in range(len(ids)):
        current_ids = ids[: i + 1]
        current_text = tokenizer.decode(current_ids)
        delta = parser.extract_reasoning_streaming(
            previous_text, current_text, current_text[len(previous_text):], previous_ids, current_ids, [ids[i]])
        if delta is not None:
            streamed["reasoning"] += delta.reasoning or ""
            streamed["content"] += delta.content or ""
        previous_text, previous_ids = current_text, current_ids
    return {"reasoning": reasoning, "content": content,
            "stream_reasoning": streamed["reasoning"], "stream_content": streamed["content"]}


def results(parser_cls: Any, tokenizer: Any) -> list[dict[str, Any]]:
    return [{"thinking": c["thinking"], "output": c["output"], **run(parser_cls, tokenizer, c["thinking"], c["output"])}
            for c in load_cases()]
