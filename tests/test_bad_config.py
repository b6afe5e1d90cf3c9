"""Bad configuration, tried for real: one table of wrong settings, each given to entrypoint.py in a
subprocess the way a container gets it (env, YAML file or command line). Every one must exit 2
within seconds, before vLLM starts (no plan logged, no engine line), with one message that names
the setting and says how to fix it.

The table (CASES) is tests/support/bad_config.py; docs/reliability.md "Bad configuration" shows it
(`make docs` generates it; tests/test_doc_tables.py keeps the two in sync).
"""

from __future__ import annotations

import json
import statistics

import pytest

from support.bad_config import CASES, Case
from support.launcher import SECRET, launcher_env, run_entrypoint

FAST_FAIL_S = 30  # hang guard for mistakes found without importing vLLM (measured ~0.3-1 s)
VLLM_PARSER_FAIL_S = 120  # hang guard where vLLM's own parser judges (imports vLLM: ~8-20 s)
# What a started server would print: none of it may appear before a configuration error.
STARTED_MARKERS = ("launch plan", "APIServer", "EngineCore", "Loading weights", "Starting vLLM")
def case_id(case: Case) -> str:
    return case.what.replace(" ", "-")


@pytest.fixture(scope="module")
def timings():
    """Seconds per case, summarised once the module is done (the report's figures)."""
    seconds: dict[str, float] = {}
    yield seconds
    if seconds:
        values = sorted(seconds.values())
        print(f"\nbad configuration: {len(values)} cases, all exit 2; seconds min {values[0]:.2f}, "
              f"median {statistics.median(values):.2f}, max {values[-1]:.2f}")
        for what, s in sorted(seconds.items(), key=lambda kv: kv[1]):
            print(f"  {s:6.2f} s  {what}")


def test_at_least_twenty_distinct_cases():
    assert len(CASES) >= 20
    assert len({c.what for c in CASES}) == len(CASES)
    assert len({json.dumps([c.env, c.args, c.given]) for c in CASES}) == len(CASES)


# The cases vLLM's own parser judges import it (~10 s each): the slow tier. Of the others, one or
# more of each area and way of giving a setting (env, flag, YAML, a damaged checkpoint, a key file)
# run in `make check` too; every case runs in `make test` (each is a process of its own: ~0.4-1 s).
IN_CHECK = {
    "port above 65535", "port 0 on the command line", "a boolean where a count belongs (YAML)",
    "checkpoint with truncated weights", "unknown key (typo)", "a setting's flag given twice",
    "API key given twice (env and file)", "a URL where a host name belongs",
}


def case_marks(case: Case) -> list[pytest.MarkDecorator]:
    return [] if case.what in IN_CHECK and not case.vllm else [pytest.mark.slow]


def test_the_cases_in_make_check_are_cases() -> None:
    assert IN_CHECK <= {c.what for c in CASES if not c.vllm}


@pytest.mark.parametrize("case", [pytest.param(c, marks=case_marks(c)) for c in CASES], ids=case_id)
def test_bad_setting_exits_2_fast_with_key_and_fix(case: Case, tiny_config, tmp_path, timings):
    args, env = case.inputs(tmp_path, tiny_config)
    bound = VLLM_PARSER_FAIL_S if case.vllm else FAST_FAIL_S
    result, seconds = run_entrypoint(*args, env=launcher_env(**env), timeout=bound * 2)
    timings[case.what] = seconds
    err = result.stderr
    assert result.returncode == 2, err
    assert f"configuration error in `{case.key}`" in err, err
    fix = next((line for line in err.splitlines() if line.strip().startswith("fix:")), "")
    assert case.fix in fix, err
    assert result.stdout == "", result.stdout
    assert not [m for m in STARTED_MARKERS if m in err], err  # vLLM never started
    assert SECRET not in err
    assert seconds < bound
