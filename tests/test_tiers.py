"""tests/tiers.py itself: an `engine` test declares how many vLLM engines it starts, and starting more
fails it. The inner pytest runs start stand-ins named the way vLLM titles its engine process
(`VLLM::EngineCore`, set with `exec -a`), which is what the tiers plugin recognises; no vLLM runs.
The inner runs recognise another title and command, so that this outer run does not count their
stand-ins."""

from __future__ import annotations

import pathlib

import pytest

pytest_plugins = ["pytester"]

TESTS = pathlib.Path(__file__).resolve().parent

INNER = '''
import subprocess, time
import pytest

def start_engines(n):  # stand-ins titled like vLLM's engine core
    procs = [subprocess.Popen(["bash", "-c", 'exec -a "STAND-IN-VLLM::EngineCore_0" sleep 5']) for _ in range(n)]
    time.sleep(0.8)  # the inner runs sample every 0.2 s (conftest below)
    for p in procs:
        p.kill()
        p.wait()

@pytest.mark.engine(engines=1)
def test_one_engine_as_declared():
    start_engines(1)

@pytest.mark.engine(engines=1)
def test_two_engines_over_a_budget_of_one():
    start_engines(2)

@pytest.mark.engine(engines=2)
def test_two_engines_as_declared():
    start_engines(2)
'''


@pytest.fixture
def inner(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest("import tiers\ntiers.VLLM_TITLE = 'STAND-IN-VLLM::'\n"
                          "tiers.VLLM_COMMANDS = {'stand-in-vllm'}\n"
                          "tiers.PY312_VENV = '/stand-in-venv-py312/'\n"
                          "tiers.POLL_S = 0.2\n"  # the stand-ins live 0.8 s: 4 scans, not 1.5 s for 3
                          "def pytest_configure(config):\n    config.pluginmanager.register(tiers, 'tiers')\n")
    pytester.makeini(f"[pytest]\npythonpath = {TESTS}\nmarkers =\n    server\n    engine\n    slow\n    py312\n")
    return pytester


def test_an_engine_test_starting_more_engines_than_it_declares_fails(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_inner=INNER)
    result = inner.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*test_two_engines_over_a_budget_of_one*beyond the test's declared engines=1*"])


# Each an inner pytest run (~0.8 s): the bare marker in make check, the wrong budgets in make test.
@pytest.mark.parametrize("marker", ["engine", *(pytest.param(m, marks=pytest.mark.slow)
                                                for m in ("engine(engines=0)", "engine(engines='2')"))])
def test_an_engine_test_without_a_budget_is_refused_at_collection(inner: pytest.Pytester, marker: str) -> None:
    inner.makepyfile(test_inner=f"import pytest\n@pytest.mark.{marker}\ndef test_x():\n    pass\n")
    result = inner.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*marked `engine` without `engines=N`*"])


FORK = '''
import os, time
import torch  # mapped into this process, so into a fork of it too

def test_a_fork_that_has_not_exec_d_is_not_a_process_that_loads_torch():
    pid = os.fork()
    if pid == 0:  # what subprocess's child is between fork and exec, held for 4 scans
        time.sleep(0.8)
        os._exit(0)
    os.waitpid(pid, 0)
'''


@pytest.mark.slow  # the inner pytest imports torch
def test_a_fork_of_pytest_before_its_exec_is_not_flagged(inner: pytest.Pytester) -> None:
    """A subprocess started from a pytest process that has imported torch is, between fork and exec,
    a copy of pytest with torch mapped: judged then, any unmarked test that ran a command failed
    and the command was killed (seen on a loaded machine: kubectl killed with -9, 89 errors)."""
    inner.makepyfile(test_inner=FORK)
    inner.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


PY312 = '''
import pathlib, shutil, subprocess, time
import pytest

def run_the_second_python():  # a stand-in for .venv-py312/bin/python: `sleep`, under that path
    python = pathlib.Path.cwd() / "stand-in-venv-py312" / "bin" / "python"
    python.parent.mkdir(parents=True, exist_ok=True)
    if not python.exists():
        python.symlink_to(shutil.which("sleep"))
    proc = subprocess.Popen([str(python), "5"])
    time.sleep(0.8)  # the inner runs sample every 0.2 s (conftest below)
    proc.kill()
    proc.wait()

def test_unmarked():
    run_the_second_python()

@pytest.mark.py312
def test_marked():
    run_the_second_python()
'''


def test_a_test_running_the_second_python_unmarked_fails(inner: pytest.Pytester) -> None:
    """`make check` deselects `py312` and builds no 3.12 venv: a test that runs one unmarked would
    need it there."""
    inner.makepyfile(test_inner=PY312)
    result = inner.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_unmarked*a process of the Python 3.12 venv started: mark it `py312`*"])


SHARED = '''
import subprocess, time
import pytest

@pytest.mark.server
@pytest.mark.parametrize("i", range(4))
def test_asks_the_shared_server(server, i):
    time.sleep(0.2)

@pytest.mark.server
@pytest.mark.parametrize("i", range(2))
def test_asks_the_other_server(other_server, i):
    time.sleep(0.2)

@pytest.mark.server
def test_asks_the_other_and_the_47_server(other_server, server_47):
    time.sleep(0.2)

@pytest.mark.server
def test_asks_the_47_server(server_47):
    time.sleep(0.2)

@pytest.mark.parametrize("i", range(4))
def test_needs_no_server(i):
    time.sleep(0.2)

@pytest.mark.engine(engines=1)
def test_starts_an_engine():
    proc = subprocess.Popen(["bash", "-c", 'exec -a "STAND-IN-VLLM::EngineCore_0" sleep 5'])
    time.sleep(0.8)  # the inner runs sample every 0.2 s (conftest below)
    proc.kill()
    proc.wait()
'''

SHARED_FIXTURE = '''
import os, pathlib
import pytest

def record(event, name):  # the shared servers' stand-ins: "start|stop NAME WORKER" in events.txt
    with open(pathlib.Path(__file__).parent / "events.txt", "a") as events:
        events.write(f"{event} {name} {os.environ.get('PYTEST_XDIST_WORKER', 'no-worker')}\\n")

def serve(name):
    record("start", name)
    yield
    record("stop", name)

@pytest.fixture(scope="session")
def server():
    yield from serve("server")

@pytest.fixture(scope="session")
def other_server():
    yield from serve("other_server")

@pytest.fixture(scope="session")
def server_47():
    yield from serve("server_47")
'''


def events(inner: pytest.Pytester) -> list[tuple[str, str, str]]:
    return [tuple(line.split()) for line in (inner.path / "events.txt").read_text().splitlines()]


@pytest.mark.slow  # the shared servers' lifetimes (make test's; make check starts none), in an inner pytest run: ~4-6 s
def test_shared_server_tests_run_on_one_worker_and_the_summary_counts_every_worker(inner: pytest.Pytester) -> None:
    """`make test`'s two workers (--dist loadgroup): the tests of a shared server all run on one
    worker, so each session fixture starts once (pytest 9.2 ignores pytest-xdist 3.8.0's own group
    suffix: tests/tiers.py adds it); a test using two shared servers joins their groups; the
    engines the workers start are listed by the controller."""
    inner.makeconftest(inner.path.joinpath("conftest.py").read_text() + SHARED_FIXTURE)
    inner.makepyfile(test_inner=SHARED)
    result = inner.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "-v")
    result.assert_outcomes(passed=13)
    starts = sorted(name for event, name, _ in events(inner) if event == "start")
    assert starts == ["other_server", "server", "server_47"], starts

    def workers(*names: str) -> set[str]:
        return {line.split("]")[0] for line in result.outlines if "PASSED" in line and any(n in line for n in names)}

    assert len(workers("test_asks_the_shared_server")) == 1, result.outlines
    assert len(workers("test_asks_the_other", "test_asks_the_47")) == 1, result.outlines
    groups = {line.rpartition("@")[2].split()[0] for line in result.outlines if "PASSED" in line and "@" in line}
    assert groups == {"shared-server", "shared-other_server+server_47"}, result.outlines
    result.stdout.fnmatch_lines(["*0 API servers, 1 engine cores, by test:*",
                                 "*test_starts_an_engine: 1 x STAND-IN-VLLM::EngineCore_0*",
                                 "least memory available while a test ran: * MiB, during test_inner.py::*"])


@pytest.mark.slow  # the shared servers' lifetimes (make test's; make check starts none), in an inner pytest run: ~4-6 s
def test_a_worker_stops_a_shared_server_when_its_group_is_done(inner: pytest.Pytester) -> None:
    """One worker runs every group in turn (--dist loadgroup, -n 1): each shared server starts once
    and is stopped before the next group's server starts, not at the session's end; the merged
    group's two servers live through all of their tests."""
    inner.makeconftest(inner.path.joinpath("conftest.py").read_text() + SHARED_FIXTURE)
    inner.makepyfile(test_inner=SHARED)
    inner.runpytest_subprocess("-p", "no:cacheprovider", "-n", "1", "--dist", "loadgroup").assert_outcomes(passed=13)
    alive: set[str] = set()
    group = {"server": {"server"}, "other_server": {"other_server", "server_47"}, "server_47": {"other_server", "server_47"}}
    for event, name, _ in events(inner):
        if event == "start":
            assert alive <= group[name], (name, alive, events(inner))
            alive.add(name)
        else:
            alive.remove(name)
    assert sorted(name for event, name, _ in events(inner) if event == "start") == ["other_server", "server", "server_47"]


@pytest.mark.slow  # the shared servers' lifetimes (make test's; make check starts none), in an inner pytest run: ~4-6 s
def test_without_workers_shared_servers_live_to_the_end(inner: pytest.Pytester) -> None:
    """One process, the tests in file order (a server's tests apart): nothing stops early, so
    nothing starts twice."""
    inner.makeconftest(inner.path.joinpath("conftest.py").read_text() + SHARED_FIXTURE)
    inner.makepyfile(test_inner=SHARED)
    inner.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=13)
    recorded = [event for event, _, _ in events(inner)]
    assert recorded == ["start"] * 3 + ["stop"] * 3, events(inner)


FORKING_SERVER = '''
import os, subprocess, sys, time
import pytest

SERVER = """
import os, time
if os.fork() == 0:  # vLLM's engine core, between its fork and its setproctitle: the server's command line
    time.sleep(1.0)
    os._exit(0)
time.sleep(1.2)
"""

@pytest.mark.engine(engines=1)
def test_one_server_whose_child_keeps_its_command_line_for_a_while(tmp_path):
    script = tmp_path / "stand-in-vllm"  # `python .../stand-in-vllm serve`: a vLLM API server to this run
    script.write_text(SERVER)
    subprocess.run([sys.executable, str(script), "serve"], check=True, timeout=30)
'''


@pytest.mark.slow  # an inner pytest run whose stand-in server forks and lives 1.2 s: ~3 s
def test_a_fork_of_a_server_is_not_a_second_server(inner: pytest.Pytester) -> None:
    """vLLM forks its engine core, which keeps the API server's command line until it retitles
    itself: a scan in that window (likely under load) must not count a second server."""
    inner.makepyfile(test_inner=FORKING_SERVER)
    result = inner.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*1 API servers, 0 engine cores, by test:*"])
