"""`--reasoning-parser minicpmv` on vLLMs that lack it (0.23 has only `qwen3`).

MiniCPM-V 4.6-Thinking's chat template ends the prompt with `<think>\\n`: the output starts INSIDE
the reasoning and only `</think>` appears in it; `enable_thinking: false` puts an empty
`<think>\\n\\n</think>\\n\\n` in the prompt instead. vLLM 0.23's `qwen3` parser already splits that
correctly with thinking on (checked in plugin/tests against 0.23's real parser, streaming and
not); vLLM >= 0.32 ships a `minicpmv` parser. This registers `minicpmv` as vLLM's own `qwen3`
parser plus what 0.32's `minicpmv` does differently: no reasoning is None rather than "", and with
thinking disabled everything is content (0.23's qwen3 streams it as reasoning if its server ever
asks; it normally does not, seeing `</think>` at the end of the prompt) and a stray
`<think>...</think>` block is dropped instead of returned as reasoning. So one serving
configuration (`--reasoning-parser minicpmv`) gives the same results on both stacks.

vLLM 0.30 (and later) drives reasoning parsers through its parser engine: `qwen3` there is an
adapter around `vllm.parser.qwen3.Qwen3Parser`, with no string-level hooks to override. On such a
vLLM `minicpmv` is 0.32's own design instead: the qwen3 adapter around a `Qwen3Parser` subclass
with 0.32's `minicpmv` grammar (`minicpmv_config`: a stray `<think>` block dropped with thinking
off, `<|im_end|>` and the reserved markers passed through) and its thinking-off behaviour.

Not carried over from 0.32's parser: its recovery of newlines the real tokenizer decodes as a
literal backslash-n (and, on vLLM 0.23, its pass-through of `<|im_end|>`/reserved markers; both
only visible with `skip_special_tokens: false` or the released tokenizer's quirks).

Applies when: vLLM has no reasoning parser named `minicpmv`.
Delete when: the image's vLLM has `minicpmv` (vLLM >= 0.32).
"""

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
