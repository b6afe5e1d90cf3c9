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

Not carried over from 0.32's parser: its recovery of newlines the real tokenizer decodes as a
literal backslash-n, and its pass-through of `<|im_end|>`/reserved markers (both only visible with
`skip_special_tokens: false` or the released tokenizer's quirks).

Applies when: vLLM has no reasoning parser named `minicpmv`.
Delete when: the image's vLLM has `minicpmv` (vLLM >= 0.32).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from vllm.reasoning import ReasoningParserManager

_Qwen3ReasoningParser: Any = ReasoningParserManager.get_reasoning_parser("qwen3")
DeltaMessage: Any = sys.modules[_Qwen3ReasoningParser.__module__].DeltaMessage


class MiniCPMVThinkingReasoningParser(_Qwen3ReasoningParser):  # type: ignore[misc, valid-type]
    """vLLM's qwen3 parser; thinking defaults to on, and off means content only."""

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
        return DeltaMessage(content=delta_text) if delta_text else None
