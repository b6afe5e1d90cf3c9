"""`tool_choice=auto` on the model's documented output format, through vLLM 0.32's own parsers.

The random-weight model never writes a tool call by itself, so the server cannot show `auto`
parsing; this does, with the parser vLLM's server composes from the launcher's defaults (the
`minicpmv` reasoning parser and the `qwen3_coder` tool parser) and with `qwen3`, the reasoning
parser of vLLM builds without `minicpmv`. The same cases run on vLLM 0.23's code in
plugin/tests/test_tool_parsing_vllm023.py, and on vLLM 0.30's here when its venv is present. Forced calls (`required`, a named function) run against
the real server in tests/test_openai_client.py.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO
from minicpmv_ascend import settings, tool_calls

sys.path.insert(0, str(REPO / "plugin" / "tests"))
import tool_parsing_harness as harness


@pytest.fixture(scope="module", params=["minicpmv", "qwen3"])
def parsers(request, tiny_config):
    return harness.Harness(tiny_config, request.param)


def test_the_defaults_name_parsers_this_vllm_has():
    assert settings.SETTINGS_BY_NAME["tool_call_parser"].default in tool_calls.registered_tool_parsers()
    assert settings.SETTINGS_BY_NAME["enable_auto_tool_choice"].default is True
    assert settings.auto_reasoning_parser() == "minicpmv"


@pytest.mark.parametrize("case", harness.CASES, ids=lambda case: case.name)
def test_documented_format_parses_whole_and_streamed(parsers, case):
    whole, streamed = parsers.whole(case), parsers.streamed(case)
    assert harness.problems(case, whole) == [], "non-streaming"
    assert harness.problems(case, streamed) == [], "streaming"


VLLM030 = os.environ.get("VLLM030_PYTHON") or str(REPO / ".venv-vllm030" / "bin" / "python")
ON_VLLM030 = textwrap.dedent("""
    import json, pathlib, sys
    sys.path.insert(0, "plugin/tests")
    import tool_parsing_harness as harness
    from vllm.plugins import load_general_plugins
    from vllm.reasoning import ReasoningParserManager
    load_general_plugins()  # registers `minicpmv` where this vLLM lacks it
    out = {}
    for name in ("minicpmv", "qwen3"):
        if name not in ReasoningParserManager.list_registered():
            out[name] = "not registered"
            continue
        parsers = harness.Harness(pathlib.Path(sys.argv[1]), name)
        out[name] = {case.name: harness.problems(case, parsers.whole(case)) + harness.problems(case, parsers.streamed(case))
                     for case in harness.CASES}
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.skipif(not pathlib.Path(VLLM030).exists(),
                    reason=f"no vLLM 0.30 venv here ({VLLM030}; `make venv-vllm030` or VLLM030_PYTHON)")
def test_documented_format_on_vllm030(tiny_config):
    """vLLM 0.30 (vllm-ascend v0.30.0's): the same cases, through its own parsers."""
    proc = subprocess.run([VLLM030, "-c", ON_VLLM030, str(tiny_config)], capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT ")).removeprefix("RESULT "))
    assert out["qwen3"] == {case.name: [] for case in harness.CASES}
    assert out["minicpmv"] in ("not registered", {case.name: [] for case in harness.CASES})
