"""Registration of the `minicpmv` reasoning parser (see reasoning_parser.py for the parser)."""

from __future__ import annotations

from typing import Any

from ._base import AT_REGISTER, Patch

NAME = "reasoning-parser"
PARSER = "minicpmv"


def check(_: Any) -> str | None:
    from vllm.reasoning import ReasoningParserManager

    if PARSER in ReasoningParserManager.list_registered():
        return f"vLLM has a '{PARSER}' reasoning parser"
    if "qwen3" not in ReasoningParserManager.list_registered():
        return "vLLM has neither 'minicpmv' nor the 'qwen3' parser it would extend"
    return None


def apply(_: Any) -> None:
    from vllm.reasoning import ReasoningParserManager

    # Lazy: the parser module (and vLLM's qwen3 parser it extends) is imported on first use only.
    ReasoningParserManager.register_lazy_module(
        PARSER, "minicpmv_ascend_plugin.reasoning_parser", "MiniCPMVThinkingReasoningParser")


PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary="registers --reasoning-parser minicpmv (vLLM's qwen3 parser, thinking on by default)",
    upstream="vLLM >= 0.32 ships vllm/reasoning/minicpmv_reasoning_parser.py",
    check=check,
    apply=apply,
)
