"""The `minicpmv` reasoning parser the `reasoning-parser` patch registers on vLLMs that lack it
(its record, in reasoning.py, says what it does on each vLLM)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from typing import Any

from vllm.reasoning import ReasoningParserManager

_Qwen3ReasoningParser: Any = ReasoningParserManager.get_reasoning_parser("qwen3")
# vLLM >= 0.30: the qwen3 reasoning parser is an adapter around a parser engine (Qwen3Parser).
_Qwen3Engine: Any = getattr(_Qwen3ReasoningParser, "_parser_engine_cls", None)


class _StringQwen3MiniCPMVParser(_Qwen3ReasoningParser):  # type: ignore[misc, valid-type]
    """vLLM 0.23's qwen3 parser; thinking defaults to on, and off means content only."""

    def __init__(self, tokenizer: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(tokenizer, *args, **kwargs)
        chat_kwargs = kwargs.get("chat_template_kwargs", {}) or {}
        self.thinking_enabled = chat_kwargs.get("enable_thinking", True)

    def extract_reasoning(self, model_output: str, request: Any) -> tuple[str | None, str | None]:
        reasoning, content = super().extract_reasoning(model_output, request)
        if self.thinking_enabled:
            return reasoning or None, content  # "" when the output opens with </think>: none
        return None, content

    def extract_reasoning_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
    ) -> Any:
        if self.thinking_enabled or self.start_token_id in current_token_ids:
            delta = super().extract_reasoning_streaming(
                previous_text, current_text, delta_text,
                previous_token_ids, current_token_ids, delta_token_ids,
            )
            if self.thinking_enabled or delta is None:
                return delta
            delta.reasoning = None  # thinking off: a stray <think> block is dropped
            return delta if delta.content else None
        delta_message = sys.modules[_Qwen3ReasoningParser.__module__].DeltaMessage  # vLLM 0.23's place
        return delta_message(content=delta_text) if delta_text else None


def _engine_parser() -> Any:
    """vLLM 0.32's `minicpmv` (vllm/parser/minicpmv.py, `MiniCPMVParser` and `minicpmv_config`)
    on this vLLM's parser engine, without its newline recovery."""
    from dataclasses import replace

    from vllm.parser.engine.parser_engine import ParserEngine
    from vllm.parser.engine.parser_engine_config import ParserState, Transition

    qwen3_config = sys.modules[_Qwen3Engine.__module__].qwen3_config

    @functools.cache
    def minicpmv_config(thinking: bool) -> Any:
        base = qwen3_config(thinking=thinking, name="minicpmv" if thinking else "minicpmv_no_thinking")
        transitions = dict(base.transitions)
        if not thinking:  # a stray <think>...</think> is dropped, not printed
            transitions[(ParserState.CONTENT, "THINK_START")] = Transition(ParserState.REASONING)
            base = replace(base, strip_trailing_reasoning_whitespace=False)
        terminals, token_id_terminals = dict(base.terminals), dict(base.token_id_terminals)
        markers = [("IM_END", "<|im_end|>", True)]
        for index in range(12, 16):  # MiniCPM-V's reserved marker tokens
            markers += [(f"RESERVED_TEXT_{index}", f"<reserved_{index}>", False),
                        (f"RESERVED_TOKEN_{index}", f"<|reserved_{index}|>", True)]
        for name, text, is_token in markers:  # passed through, never content
            terminals[name] = text
            if is_token:
                token_id_terminals[name] = text
            for state in (ParserState.CONTENT, ParserState.REASONING):
                transitions[(state, name)] = Transition(state)
        return replace(base, terminals=terminals, token_id_terminals=token_id_terminals, transitions=transitions)

    class MiniCPMVParser(_Qwen3Engine):  # type: ignore[misc, valid-type]
        CONFIG_NAME = "minicpmv"

        def __init__(self, tokenizer: Any, tools: Any = None, **kwargs: Any) -> None:
            chat_kwargs = kwargs.get("chat_template_kwargs", {}) or {}
            thinking_enabled = chat_kwargs.get("enable_thinking", True)
            kwargs.setdefault("parser_engine_config", minicpmv_config(thinking_enabled))
            super().__init__(tokenizer, tools, **kwargs)
            self.thinking_enabled = thinking_enabled

        @property
        def reasoning_ended(self) -> bool:
            return True if not self.thinking_enabled else super().reasoning_ended

        def extract_reasoning(self, model_output: str, request: Any) -> tuple[str | None, str | None]:
            if self.thinking_enabled:
                return super().extract_reasoning(model_output, request)
            return None, ParserEngine.extract_reasoning(self, model_output, request)[1]

        def extract_reasoning_streaming(self, *args: Any) -> Any:
            if self.thinking_enabled:
                return super().extract_reasoning_streaming(*args)
            delta = ParserEngine.extract_reasoning_streaming(self, *args)
            if delta is None:
                return None
            delta.reasoning = None
            return None if delta.content is None and not delta.tool_calls else delta

        def get_streaming_fallback_content(self, text: str, request: Any) -> str | None:
            if self.thinking_enabled:
                return super().get_streaming_fallback_content(text, request)
            delta = ParserEngine.finish_streaming(self)
            return delta.content if delta is not None else None

    return MiniCPMVParser


if _Qwen3Engine is None:
    MiniCPMVThinkingReasoningParser: Any = _StringQwen3MiniCPMVParser
else:
    class MiniCPMVThinkingReasoningParser(_Qwen3ReasoningParser):  # type: ignore[no-redef, misc, valid-type]
        """vLLM's qwen3 reasoning adapter around the `minicpmv` parser engine."""

        _parser_engine_cls = _engine_parser()
