"""`tool_choice=auto` on the target's own parsers (what vllm-ascend's image of that release runs):
the launcher's defaults (`qwen3_coder`, and `minicpmv`, which this plugin registers where the
target has none) and the target's `qwen3`, on the model's documented output format, whole and
token by token (tool_parsing_harness.py; the same cases run on vLLM 0.32 in
tests/test_tool_parsing.py)."""

from __future__ import annotations

import pytest

import tool_parsing_harness as harness


def test_the_target_registers_the_default_tool_parser(target):
    from vllm.tool_parsers import ToolParserManager

    from minicpmv_ascend import settings, vllm_source

    assert settings.SETTINGS_BY_NAME["tool_call_parser"].default in ToolParserManager.list_registered()
    assert "qwen3_coder" in vllm_source.registered_tool_parsers()  # what the launcher reads from source
    # Neither target has --tool-strict-level (vLLM >= 0.32): the launcher does not pass it.
    assert not vllm_source.has_tool_strict_level()


@pytest.fixture(scope="module", params=["minicpmv", "qwen3"])
def parsers(request, checkpoint, minicpmv_parser):
    return harness.Harness(checkpoint, request.param)


@pytest.mark.parametrize("case", harness.CASES, ids=lambda case: case.name)
def test_documented_format_parses_whole_and_streamed(parsers, case):
    whole, streamed = parsers.whole(case), parsers.streamed(case)
    assert harness.problems(case, whole) == [], "non-streaming"
    assert harness.problems(case, streamed) == [], "streaming"
