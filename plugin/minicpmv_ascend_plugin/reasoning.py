"""Registration of the `minicpmv` reasoning parser (see reasoning_parser.py for the parser: on vLLM
0.23 a subclass of the string-level `qwen3` parser, on vLLM >= 0.30 0.32's `minicpmv` grammar on
the parser engine that `qwen3` runs on)."""

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
    summary="registers --reasoning-parser minicpmv: vLLM 0.32's minicpmv results, built on this vLLM's qwen3 "
    "parser (thinking on by default)",
    upstream="vLLM >= 0.32 ships vllm/reasoning/minicpmv_reasoning_parser.py",
    check=check,
    apply=apply,
)
