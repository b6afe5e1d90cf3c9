"""`tool_choice=auto` on vLLM 0.23's own parsers (vllm-ascend 0.23's image): the launcher's defaults
(`qwen3_coder`, and `minicpmv` which this plugin registers on 0.23) and 0.23's `qwen3`, on the model's
documented output format, whole and token by token (tool_parsing_harness.py; the same cases run on
vLLM 0.32 in tests/test_tool_parsing.py)."""

from __future__ import annotations

import pytest
import tool_parsing_harness as harness
from access_harness import borrow_api_server_packages

# 0.23's venv holds vLLM's model code; its serving layer also needs partial_json_parser and FastAPI,
# borrowed from the CPU venv behind 0.23's own packages (vLLM stays 0.23), as serve_harness.py does.
borrow_api_server_packages()


def test_vllm023_registers_the_default_tool_parser():
    from vllm.tool_parsers import ToolParserManager

    from minicpmv_ascend import settings, tool_calls

    assert settings.SETTINGS_BY_NAME["tool_call_parser"].default in ToolParserManager.list_registered()
    assert "qwen3_coder" in tool_calls.registered_tool_parsers()  # what the launcher reads from source
    assert not tool_calls.has_tool_strict_level()  # 0.23 has no --tool-strict-level: not passed


@pytest.fixture(scope="module", params=["minicpmv", "qwen3"])
def parsers(request, checkpoint):
    from minicpmv_ascend_plugin import reasoning

    if request.param == "minicpmv" and reasoning.check(None) is None:
        reasoning.apply(None)  # what the plugin does on 0.23
    return harness.Harness(checkpoint, request.param)


@pytest.mark.parametrize("case", harness.CASES, ids=lambda case: case.name)
def test_documented_format_parses_whole_and_streamed(parsers, case):
    whole, streamed = parsers.whole(case), parsers.streamed(case)
    assert harness.problems(case, whole) == [], "non-streaming"
    assert harness.problems(case, streamed) == [], "streaming"
