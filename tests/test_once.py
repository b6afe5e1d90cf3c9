"""tests/support/once.py: a session fixture made with `once` is made once per run, not once per
pytest-xdist worker, and every worker gets what was made (an inner pytest on two workers)."""

from __future__ import annotations

import pathlib

import pytest

pytest_plugins = ["pytester"]

TESTS = pathlib.Path(__file__).resolve().parent

CONFTEST = '''
import os, pathlib
import pytest
from support.once import once

@pytest.fixture(scope="session")
def made(tmp_path_factory):
    def make(out):
        with open(pathlib.Path(__file__).parent / "makes.txt", "a") as makes:
            makes.write(os.environ.get("PYTEST_XDIST_WORKER", "no worker") + "\\n")
        out.write_text("made")
    return once(tmp_path_factory, "thing", make)
'''

INNER = '''
import os, time
import pytest

@pytest.mark.parametrize("i", range(6))
def test_uses_it(made, i):
    time.sleep(0.1)
    assert made.read_text() == "made"
    with open(made.parent / "uses.txt", "a") as uses:
        uses.write(os.environ.get("PYTEST_XDIST_WORKER", "no worker") + "\\n")
'''


@pytest.mark.parametrize("args", [("-n", "2"), ()], ids=["two workers", "one process"])
def test_made_once_per_run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # this run's own worker, if any
    pytester.makeconftest(CONFTEST)
    pytester.makeini(f"[pytest]\npythonpath = {TESTS}\n")
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--basetemp", str(pytester.path / "tmp"), *args)
    result.assert_outcomes(passed=6)
    assert len((pytester.path / "makes.txt").read_text().splitlines()) == 1
    uses = (pytester.path / "tmp" / "uses.txt").read_text().splitlines()
    assert len(uses) == 6 and set(uses) == ({"gw0", "gw1"} if args else {"no worker"})  # both workers used it
