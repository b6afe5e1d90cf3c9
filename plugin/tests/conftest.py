"""Fixtures for the tests that run against an Ascend target's own vLLM code (`make test` runs them
once per target: `.venv-vllm030/bin/python -m pytest plugin/tests`, then `.venv-vllm023/...`)."""

from __future__ import annotations

import contextlib
import pathlib
import sys
from collections.abc import Iterator

import pytest

from _harness import harnesses
from _target import Forked, Target, VllmCode, current_target


def pytest_sessionstart(session: pytest.Session) -> None:
    current_target()  # a wrong venv fails loudly instead of skipping everything


def pytest_report_header() -> str:
    target = current_target()
    return f"Ascend target {target.tag}: vLLM {target.vllm}, transformers {target.transformers_pin}"


@pytest.fixture(scope="session")
def target() -> Target:
    return current_target()


@pytest.fixture(scope="session")
def waiting_harnesses(target: Target) -> Iterator[dict[str, tuple[Forked, ...]]]:
    """The server-loop scenarios that mostly wait (a drain, a grace period, the bug's hang: see
    test_server_patches.py), each with and without the plugin, all started together; killed at the
    session's end if still running."""
    scenarios = {"death": ("death",), "sigterm": ("sigterm",), "drain": ("drain",)}
    if target.needs("uvicorn-signals"):
        scenarios["drain-uvicorn-signals"] = ("drain", {"MINICPMV_HARNESS_UVICORN_SIGNALS": "on"})
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(harnesses(*args)) for name, args in scenarios.items()}


@pytest.fixture(scope="session", autouse=True)
def start_waiting_harnesses_first(request: pytest.FixtureRequest) -> None:
    """Start `waiting_harnesses` with the session when a collected test uses them: their ~30 s of
    waiting then passes beside the other tests' work. Started when their tests came, they held the
    run ~30 s per target with its core idle (`make test` runs the targets side by side)."""
    if any("waiting_harnesses" in item.fixturenames for item in request.session.items):
        request.getfixturevalue("waiting_harnesses")


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    from minicpmv_ascend.checkpoint import generate

    return generate(tmp_path_factory.mktemp("ckpt") / "minicpmv46-tiny", "tiny", seed=0)


@pytest.fixture(scope="session")
def vllm_code_session(checkpoint: pathlib.Path) -> VllmCode:
    return VllmCode(checkpoint)


@pytest.fixture
def vllm_code(vllm_code_session: VllmCode):
    """The target's vLLM as released (no patch); tests call `.apply(...)`; restored afterwards."""
    vllm_code_session.restore()
    yield vllm_code_session
    vllm_code_session.restore()


@pytest.fixture(scope="module")
def minicpmv_parser(target: Target):
    """`--reasoning-parser minicpmv` as the plugin leaves it on this target: registered by the
    plugin's reasoning-parser where vLLM has none (checked: not there before), vLLM's own
    otherwise. The plugin's registration is taken back afterwards, so every test starts from the
    target's own registry."""
    from vllm.reasoning import ReasoningParserManager

    from minicpmv_ascend_plugin.patches.api import reasoning

    registered = "minicpmv" in ReasoningParserManager.list_registered()
    assert registered != target.needs("reasoning-parser")
    assert (reasoning.check(None) is None) == target.needs("reasoning-parser")
    if not registered:
        reasoning.apply(None)
    yield "minicpmv"
    if not registered:
        ReasoningParserManager.lazy_parsers.pop("minicpmv", None)
        ReasoningParserManager.reasoning_parsers.pop("minicpmv", None)


def pytest_terminal_summary(terminalreporter) -> None:
    """The sweep's mismatch table (also in build/plugin-sweep-<target>.json)."""
    report = getattr(sys.modules.get("test_sweep"), "REPORT", None)
    if not report:
        return
    write = terminalreporter.write_line
    write(f"placeholder sweep vs transformers ({report['target']}): {report['sizes']} sizes, {report['cases']} "
          f"cases, {report['seconds']} s (of which transformers {report['transformers_seconds']} s)")
    for name, configs in report["table"].items():
        write(f"  {name}:")
        for config, v in configs.items():
            write(f"    {config:<19} count mismatches {v['count_mismatches']:>4} / {v['sizes']}, "
                  f"sequence mismatches {v['sequence_mismatches']:>4} / {v['sizes']}")
    write(f"  1084x820 placeholders (16x, 4x, 16x max_slice_nums=2, 4x max_slice_nums=2): "
          f"transformers {report['anchor_expected']}, " + ", ".join(
              f"{name}: {counts}" for name, counts in report["anchor_1084x820"].items()))
