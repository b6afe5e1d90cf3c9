"""`tool_choice=auto` on the model's documented output format, through vLLM 0.32's own parsers.

The random-weight model never writes a tool call by itself, so the server cannot show `auto`
parsing; this does, with the parser vLLM's server composes from the launcher's defaults (the
`minicpmv` reasoning parser and the `qwen3_coder` tool parser) and with `qwen3`, the reasoning
parser of vLLM builds without `minicpmv`. The same cases run on each Ascend target's code (vLLM
0.30 and 0.23, in their venvs) in plugin/tests/server/test_target_tool_parsing.py. Forced calls (`required`, a
named function) run against the real server in tests/test_applications.py.
"""

from __future__ import annotations

import pytest

import tool_parsing_harness as harness
from minicpmv_ascend import settings, vllm_source


@pytest.fixture(scope="module", params=["minicpmv", "qwen3"])
def parsers(request, tiny_config):
    return harness.Harness(tiny_config, request.param)


def test_the_defaults_name_parsers_this_vllm_has():
    assert settings.SETTINGS_BY_NAME["tool_call_parser"].default in vllm_source.registered_tool_parsers()
    assert settings.SETTINGS_BY_NAME["enable_auto_tool_choice"].default is True
    assert settings.auto_reasoning_parser() == "minicpmv"


@pytest.mark.parametrize("case", harness.CASES, ids=lambda case: case.name)
def test_documented_format_parses_whole_and_streamed(parsers, case):
    whole, streamed = parsers.whole(case), parsers.streamed(case)
    assert harness.problems(case, whole) == [], "non-streaming"
    assert harness.problems(case, streamed) == [], "streaming"
