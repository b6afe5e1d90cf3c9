"""`--reasoning-parser minicpmv` on vLLMs that lack it: the parser (reasoning_parser.py) and its registration."""

from __future__ import annotations

from typing import Any

from ...core.patch import AT_REGISTER, LayoutNotFound, Patch

NAME = "reasoning-parser"
PARSER = "minicpmv"


def check(_: Any) -> str | None:
    from vllm.reasoning import ReasoningParserManager

    if PARSER in ReasoningParserManager.list_registered():
        return f"vLLM has a '{PARSER}' reasoning parser"
    if "qwen3" not in ReasoningParserManager.list_registered():
        raise LayoutNotFound("vLLM has neither 'minicpmv' nor the 'qwen3' parser it would extend")
    return None


def apply(_: Any) -> None:
    from vllm.reasoning import ReasoningParserManager

    # Lazy: the parser module (and vLLM's qwen3 parser it extends) is imported on first use only.
    ReasoningParserManager.register_lazy_module(
        PARSER, f"{__package__}.reasoning_parser", "MiniCPMVThinkingReasoningParser")


PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary=f"registers --reasoning-parser {PARSER}: vLLM 0.32's {PARSER} results, built on this vLLM's qwen3 "
            "parser (thinking on by default)",
    upstream="vLLM >= 0.32 ships vllm/reasoning/minicpmv_reasoning_parser.py",
    check=check,
    apply=apply,
    fixes=f'no `--reasoning-parser {PARSER}` in vLLM < 0.32',
    tests='`test_reasoning_parsers_match_vllm032_minicpmv`, `test_reasoning_cases_are_vllm_032_minicpmv`',
    delete_when='vLLM >= 0.32',
    details=f"""
vLLM 0.23's `qwen3` parser already handles the Thinking template (the output starts inside
`<think>`; only `</think>` appears) with thinking on, streaming or not.
It differs from 0.32's `{PARSER}` only in corner cases: "" instead of None for an empty
reasoning, and with `enable_thinking: false` it streams content as reasoning if asked (0.23's
server does not ask: it sees `</think>` at the end of the prompt) and returns a stray
`<think>...</think>` block as reasoning. On 0.23 the registered `{PARSER}` is `qwen3` plus those
three differences. vLLM 0.30 rebuilt its parsers on a parser engine (`vllm/parser/engine/`):
`qwen3` is an adapter around `vllm/parser/qwen3.py`'s `Qwen3Parser`, already right in every case
but the stray block, and it has no string-level hooks a subclass could use (0.23's subclass
failed there at import: `DeltaMessage` is no longer in the parser's module). On such a vLLM the
registered `{PARSER}` is 0.32's own design (`vllm/parser/minicpmv.py`): the same adapter around
a `Qwen3Parser` subclass with 0.32's `minicpmv_config` grammar (a stray `<think>` block dropped
with thinking off; `<|im_end|>` and the reserved markers passed through) and 0.32's thinking-off
overrides. Either way `--reasoning-parser {PARSER}` gives 0.32's results
(plugin/tests/reasoning_cases.json, produced by 0.32's parser and checked on every target). Also
through the parser object the chat server builds from the flag (`ParserManager.get_parser`,
`parse()` / `parse_delta()` with the prompt ids; reasoning_server_cases.json from 0.32): 0.30
gives 0.32's results exactly, 0.23 all but one (with thinking off, 0.32 and 0.30 stream a stray
`<think>...</think>` block as content, although their non-streaming answer drops it; 0.23 drops
it in both). Not carried over: 0.32's recovery of newlines that the released tokenizer decodes
as a literal `\\n`.
Predicate: vLLM has no reasoning parser named `{PARSER}` (it has from 0.32).
""",
    evidence={"0.30.0": ('applied', (f'`reasoning/__init__.py`: no `{PARSER}` entry (no `minicpmv_reasoning_parser.py`); `qwen3` '
                         '(:139-142) is `Qwen3ParserReasoningAdapter` (`parser/engine/registered_adapters.py:54-57`) '
                         "around `parser/qwen3.py`'s `Qwen3Parser`, identical to 0.32's; "
                         '`parser/engine/adapters.py:21` imports `DeltaMessage` only for type checking (see '
                         'reasoning-parser above)'))},
    files=('reasoning_parser.py',),
)
