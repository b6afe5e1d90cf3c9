"""Drive a vLLM reasoning parser over model outputs: the whole text at once (`extract_reasoning`)
and token by token (`extract_reasoning_streaming`) (`results`); and through the parser object
vLLM's chat server builds from `--reasoning-parser` (`ParserManager.get_parser`), with `parse()`
and `parse_delta()` given the chat template's prompt ids, as the server calls them
(`server_results`).

Shared by plugin/tests (each Ascend target's vLLM) and tests/ (vLLM 0.32); the expected results
in reasoning_cases.json and reasoning_server_cases.json are vLLM 0.32's own `minicpmv` parser's
(checked by tests/test_plugin.py and tests/test_plugin_targets.py).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

CASES = pathlib.Path(__file__).with_name("reasoning_cases.json")
SERVER_CASES = pathlib.Path(__file__).with_name("reasoning_server_cases.json")


def load_cases(path: pathlib.Path = CASES) -> list[dict[str, Any]]:
    return json.loads(path.read_text(encoding="utf-8"))


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


def server_run(parser_name: str, tokenizer: Any, thinking: bool, output: str) -> dict[str, Any]:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser import ParserManager

    kwargs = {"enable_thinking": thinking}
    messages = [{"role": "user", "content": "hi"}]
    request = ChatCompletionRequest(model="m", messages=messages, chat_template_kwargs=kwargs)
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)
    prompt_ids = list(prompt["input_ids"] if isinstance(prompt, dict) else prompt)
    parser_cls = ParserManager.get_parser(reasoning_parser_name=parser_name)
    reasoning, content, _ = parser_cls(tokenizer, None, chat_template_kwargs=kwargs).parse(output, request)

    parser = parser_cls(tokenizer, None, chat_template_kwargs=kwargs)
    ids = tokenizer.encode(output, add_special_tokens=False)
    previous_text, streamed = "", {"reasoning": "", "content": ""}
    for i in range(len(ids)):
        text = tokenizer.decode(ids[: i + 1])
        delta = parser.parse_delta(text[len(previous_text):], [ids[i]], request, prompt_token_ids=prompt_ids,
                                   finished=i == len(ids) - 1)
        if delta is not None:
            streamed["reasoning"] += delta.reasoning or ""
            streamed["content"] += delta.content or ""
        previous_text = text
    return {"reasoning": reasoning, "content": content,
            "stream_reasoning": streamed["reasoning"], "stream_content": streamed["content"]}


def server_results(parser_name: str, tokenizer: Any) -> list[dict[str, Any]]:
    return [{"thinking": c["thinking"], "output": c["output"],
             **server_run(parser_name, tokenizer, c["thinking"], c["output"])} for c in load_cases()]
