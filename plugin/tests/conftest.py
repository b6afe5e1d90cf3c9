"""Fixtures for the tests that run against vLLM 0.23.0's own code (`make test` runs them with
`.venv-vllm023/bin/python -m pytest plugin/tests`)."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _vllm023 import REPO, Vllm023, ensure_vllm023  # noqa: E402


def pytest_sessionstart(session: pytest.Session) -> None:
    ensure_vllm023()  # a wrong venv fails loudly instead of skipping everything


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    sys.path.insert(0, str(REPO / "src"))
    from minicpmv_ascend.checkpoint import generate

    return generate(tmp_path_factory.mktemp("ckpt") / "minicpmv46-tiny", "tiny", seed=0)


@pytest.fixture(scope="session")
def vllm023_session(checkpoint: pathlib.Path) -> Vllm023:
    return Vllm023(checkpoint)


@pytest.fixture
def vllm023(vllm023_session: Vllm023):
    """vLLM 0.23 as released (no patch); tests call `.apply(...)`; restored afterwards."""
    vllm023_session.restore()
    yield vllm023_session
    vllm023_session.restore()


def pytest_terminal_summary(terminalreporter) -> None:
    """The sweep's mismatch table (also in build/plugin-sweep-vllm023.json)."""
    report = getattr(sys.modules.get("test_sweep_vllm023"), "REPORT", None)
    if not report:
        return
    write = terminalreporter.write_line
    write(f"placeholder sweep vs transformers: {report['sizes']} sizes, {report['cases']} cases, "
          f"{report['seconds']} s (of which transformers {report['transformers_seconds']} s)")
    for name, configs in report["table"].items():
        write(f"  {name}:")
        for config, v in configs.items():
            write(f"    {config:<19} count mismatches {v['count_mismatches']:>4} / {v['sizes']}, "
                  f"sequence mismatches {v['sequence_mismatches']:>4} / {v['sizes']}")
    write(f"  1084x820 placeholders (16x, 4x, 16x max_slice_nums=2, 4x max_slice_nums=2): "
          f"transformers {report['anchor_expected']}, " + ", ".join(
              f"{name}: {counts}" for name, counts in report["anchor_1084x820"].items()))
