"""MiniCPM-V 4.6's tool-call output format, through the running vLLM's own parsers.

The random-weight model never writes a tool call on its own, so `tool_choice=auto` is tested here:
model outputs in the format the chat template teaches (Qwen3.5's, which vLLM's `qwen3_coder` parser
reads), parsed by the very parser vLLM's server composes from `--reasoning-parser` and
`--tool-call-parser` (`ParserManager.get_parser`), whole (non-streaming) and token by token
(streaming), with thinking on and off. What must hold: a call after a think block never leaks into
`reasoning`, the reasoning never leaks into the arguments, arguments are typed by the tool's schema,
and streaming assembles to the same answer.

Used by tests/test_tool_parsing.py (vLLM 0.32, .venv) and plugin/tests/server/test_target_tool_parsing.py (each
Ascend target's vLLM: .venv-vllm030, .venv-vllm023).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import pathlib
from typing import Any

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"},
            "options": {"type": "object", "properties": {"unit": {"type": "string"}}}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Current time in a time zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}},
]

REASONING = "The user wants the weather in Paris for three days. I should call get_weather with city Paris."


def call_text(name: str, **arguments: Any) -> str:
    """One call exactly as the chat template renders an assistant's tool call."""
    params = "".join(f"<parameter={key}>\n{json.dumps(value) if isinstance(value, (dict, list)) else value}"
                     f"\n</parameter>\n" for key, value in arguments.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    thinking: bool
    output: str  # what the model writes after the generation prompt
    reasoning: str | None
    content: str | None
    calls: tuple[tuple[str, dict[str, Any]], ...]


WEATHER = ("get_weather", {"city": "Paris", "days": 3})
CASES = (
    Case("thinking, then a call", True,
         f"{REASONING}\n</think>\n\n{call_text('get_weather', city='Paris', days=3)}",
         REASONING, None, (WEATHER,)),
    Case("thinking, a sentence, then a call", True,
         f"{REASONING}\n</think>\n\nLet me check that.\n\n{call_text('get_weather', city='Paris', days=3)}",
         REASONING, "Let me check that.", (WEATHER,)),
    Case("thinking, then two calls", True,
         f"{REASONING}\n</think>\n\n{call_text('get_weather', city='Paris', days=3)}\n"
         f"{call_text('get_time', zone='Europe/Paris')}",
         REASONING, None, (WEATHER, ("get_time", {"zone": "Europe/Paris"}))),
    Case("thinking, then an answer without a call", True,
         f"{REASONING}\n</think>\n\nIt is sunny in Paris.", REASONING, "It is sunny in Paris.", ()),
    Case("thinking off, a call with an object argument", False,
         call_text("get_weather", city="Paris", options={"unit": "celsius"}),
         None, None, (("get_weather", {"city": "Paris", "options": {"unit": "celsius"}}),)),
    Case("thinking off, a sentence, then a call", False,
         f"Checking.\n\n{call_text('get_time', zone='UTC')}", None, "Checking.", (("get_time", {"zone": "UTC"}),)),
)


@dataclasses.dataclass
class Parsed:
    reasoning: str | None
    content: str | None
    calls: list[tuple[str, dict[str, Any]]]
    reasoning_deltas: list[str] = dataclasses.field(default_factory=list)
    argument_deltas: list[str] = dataclasses.field(default_factory=list)


def _request(thinking: bool) -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                 tools=TOOLS, tool_choice="auto",
                                 chat_template_kwargs={"enable_thinking": thinking})


class Harness:
    def __init__(self, checkpoint: pathlib.Path, reasoning_parser: str, tool_parser: str = "qwen3_coder") -> None:
        from transformers import AutoTokenizer
        from vllm.parser.parser_manager import ParserManager

        self.tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        self.parser_cls = ParserManager.get_parser(tool_parser_name=tool_parser,
                                                   reasoning_parser_name=reasoning_parser, enable_auto_tools=True)

    def _parser(self, request: Any, thinking: bool) -> Any:
        # As vLLM's server builds it: the request's (validated) tools, not raw dicts.
        return self.parser_cls(self.tokenizer, request.tools, chat_template_kwargs={"enable_thinking": thinking})

    def prompt_ids(self, thinking: bool) -> list[int]:
        return list(self.tokenizer.apply_chat_template(
            [{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS, add_generation_prompt=True,
            tokenize=True, enable_thinking=thinking, return_dict=True)["input_ids"])

    def whole(self, case: Case) -> Parsed:
        request = _request(case.thinking)
        parser = self._parser(request, case.thinking)
        ids = self.tokenizer.encode(case.output, add_special_tokens=False)
        if hasattr(parser, "set_prompt_token_ids"):
            parser.set_prompt_token_ids(self.prompt_ids(case.thinking))
        kwargs = {"model_output_token_ids": ids} if "model_output_token_ids" in inspect.signature(parser.parse).parameters else {}
        reasoning, content, calls = parser.parse(case.output, request, enable_auto_tools=True, **kwargs)
        return Parsed((reasoning or "").strip() or None, (content or "").strip() or None,
                      [(c.name, json.loads(c.arguments)) for c in calls or []])

    def streamed(self, case: Case) -> Parsed:
        request = _request(case.thinking)
        parser = self._parser(request, case.thinking)
        ids = self.tokenizer.encode(case.output, add_special_tokens=False)
        prompt = self.prompt_ids(case.thinking)
        reasoning, content, names, arguments = [], [], {}, {}
        result = Parsed(None, None, [])
        previous = ""
        for i in range(len(ids)):
            text = self.tokenizer.decode(ids[: i + 1])
            delta = parser.parse_delta(text[len(previous):], [ids[i]], request, prompt_token_ids=prompt,
                                       finished=i == len(ids) - 1)
            previous = text
            if delta is None:
                continue
            piece = getattr(delta, "reasoning", None) or getattr(delta, "reasoning_content", None)
            if piece:
                reasoning.append(piece)
                result.reasoning_deltas.append(piece)
            if delta.content:
                content.append(delta.content)
            for call in delta.tool_calls or []:
                if call.function and call.function.name:
                    names[call.index] = call.function.name
                if call.function and call.function.arguments:
                    arguments[call.index] = arguments.get(call.index, "") + call.function.arguments
                    result.argument_deltas.append(call.function.arguments)
        result.reasoning = "".join(reasoning).strip() or None
        result.content = "".join(content).strip() or None
        result.calls = [(names[i], json.loads(arguments.get(i) or "{}")) for i in sorted(names)]
        return result


def problems(case: Case, parsed: Parsed) -> list[str]:
    """What is wrong with `parsed` for `case` (empty: right)."""
    found = []
    if (parsed.reasoning or None) != case.reasoning:
        found.append(f"reasoning {parsed.reasoning!r} != {case.reasoning!r}")
    if parsed.content != case.content:
        found.append(f"content {parsed.content!r} != {case.content!r}")
    if parsed.calls != [(name, args) for name, args in case.calls]:
        found.append(f"calls {parsed.calls} != {list(case.calls)}")
    leaked = [d for d in parsed.reasoning_deltas if "<tool_call>" in d or "<function=" in d or "<parameter" in d]
    if leaked:
        found.append(f"tool-call markup in reasoning deltas: {leaked}")
    if case.reasoning and any(word in d for d in parsed.argument_deltas for word in ("user wants", "should call")):
        found.append(f"reasoning in argument deltas: {parsed.argument_deltas}")
    return found
