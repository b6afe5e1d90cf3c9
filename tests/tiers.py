"""The test tiers, enforced: a pytest plugin (registered by tests/conftest.py) that holds every
test to the markers pyproject.toml registers, so that the unit tier (`make check`: none of them)
starts no vLLM and loads no torch outside the pytest process, whatever a test's author remembered.

- `server`: uses a shared vLLM server (the `server` or `other_server` fixture of tests/conftest.py).
- `engine(engines=N)`: starts vLLM itself: a server, an engine core or an offline `vllm.LLM`, and
  declares how many engine cores (model loads) it starts at most, API servers counted alike.
- `slow`: seconds of CPU but no vLLM server or engine: torch (the torch-generated random-weight
  checkpoint, `tiny_checkpoint`, or a process of its own that loads torch: vLLM's argument parser,
  its app or protocol code, a dry run of the launcher: ~10 s each), or work of that size without it
  (the full preset's 248,094-token tokenizer). Tests that only read the checkpoint's config,
  tokenizer or file layout use `tiny_config` instead.
- `py312`: runs the package on the second Python, 3.12 (the Ascend image's; `.venv-py312`, built by
  `make py312`), so that `make check` needs no second Python's venv.
- `container`: uses a real Docker engine (tests/test_containers.py): only the container phase of
  `make test` and `make test-containers` run these, in a pytest process of their own.

At collection, a test that uses a shared server's fixture (directly or through another fixture)
must be marked `server`, and a test marked `server` must use one; a test that uses `tiny_checkpoint` must
carry one of the three markers. At run time, below this pytest process: a vLLM server or engine
that appears during a test not marked `engine` (its setup, call or teardown; whatever started it:
tests/conftest.py's start_server, entrypoint.py in a subprocess, the bench's A/B, an offline LLM
in a script) fails the test and is killed; only the shared servers may start under `server`. An
`engine` test that starts more engine cores or API servers than its `engines=N` fails: each vLLM
start costs 0.5-2 minutes on a 2-core machine, so the suite's budget cannot grow unseen. A
process that loads torch during a test with none of the markers fails it too. At the end of the
run, the vLLM servers and engines it started are listed by test (what the run costs), with the
least memory the host had available while a test ran. Under `make test`'s workers a shared server
is stopped once its tests are done (pytest_runtest_teardown below).
"""

from __future__ import annotations

import os
import threading

import psutil
import pytest

MARKERS = ("server", "engine", "slow", "py312", "container")
VLLM_TITLE = "VLLM::"  # how vLLM titles its engine and worker processes (tests/test_tiers.py swaps it)
VLLM_COMMANDS = {"minicpmv_ascend.vllm_cli", "vllm"}  # `python -m X serve`, `X serve` (swapped alike)
SHARED_SERVERS = {"server", "other_server", "server_47"}  # the fixtures of tests/conftest.py
POLL_S = 0.5  # vLLM, and a Python that imports torch, live for seconds: sampled this often, none is missed
PY312_VENV = "/.venv-py312/"  # in the command line of a process of the 3.12 venv (tests/test_tiers.py swaps it)
TORCH_LIBRARY = "/torch/lib/libtorch_cpu.so"  # mapped by every process that has imported torch

SHARED_GROUP = "shared-"  # pytest-xdist groups of a shared server's tests: "shared-server", "shared-server_47" ...
STARTED = "vllm started"  # the reports' user property naming each vLLM process a test started
LEAST_AVAILABLE = "least MiB available"  # the reports' user property: the host's memory at its lowest

_allowed_sessions: set[int] = set()  # the shared servers' sessions (start_server starts new ones)
_started: list[tuple[str, str]] = []  # (test id, what started) for the summary, from the reports
_least_available: list[tuple[int, str]] = []  # (MiB, test id): the lowest the host's memory got, from the reports


def allow_shared_server(pid: int) -> None:
    """A shared server's process (a session leader): what runs in its session is allowed."""
    _allowed_sessions.add(pid)


def vllm_process(proc: psutil.Process) -> str | None:
    """What kind of vLLM process this is, or None: the API server (`vllm_cli serve`, `vllm
    serve`) or a process vLLM titles itself (VLLM::EngineCore, VLLM::Worker ...)."""
    try:
        argv = proc.cmdline()
    except psutil.Error:
        return None
    if argv and argv[0].startswith(VLLM_TITLE):
        return argv[0].split()[0]
    for i, arg in enumerate(argv[:-1]):
        if (arg in VLLM_COMMANDS or os.path.basename(arg) in VLLM_COMMANDS) and argv[i + 1] == "serve":
            return "vllm serve"
    return None


def runs_py312(proc: psutil.Process) -> bool:
    try:
        return PY312_VENV in proc.cmdline()[0]
    except (psutil.Error, IndexError):
        return False


def loads_torch(proc: psutil.Process) -> bool:
    try:
        with open(f"/proc/{proc.pid}/maps") as maps:
            return any(TORCH_LIBRARY in line for line in maps)
    except OSError:
        return False


class Watch:
    """New vLLM processes, and processes that load torch, below this pytest process while one
    test runs (setup to teardown)."""

    def __init__(self, item: pytest.Item) -> None:
        self.item = item
        marked = {m for m in MARKERS if item.get_closest_marker(m) is not None}
        self.may_start_vllm = "engine" in marked
        self.engines_allowed = engines_declared(item) if self.may_start_vllm else 0
        self.counts = {"vllm serve": 0, "engine core": 0}
        self.may_run_py312 = "py312" in marked
        self.may_load_torch = bool(marked - {"py312"})
        self.me = psutil.Process()
        self.before = {p.pid for p in self.me.children(recursive=True)}
        self.seen: set[int] = set()
        self.started: list[str] = []  # kinds, moved into the test's reports (xdist sends them home)
        self.least_available_mib = available_mib()
        self.violations: list[str] = []
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(POLL_S):
            self.scan()

    def scan(self) -> None:
        with self.lock:
            self.least_available_mib = min(self.least_available_mib, available_mib())
            try:
                children = self.me.children(recursive=True)
            except psutil.Error:
                return
            for proc in children:
                if proc.pid in self.before or proc.pid in self.seen:
                    continue
                # A process that is neither (yet) is looked at again next time: a launcher may
                # exec vLLM, a script import torch, after a while. So is a fork that has not exec'd
                # or retitled itself yet: it still has its parent's command line (and mappings).
                # subprocess's child between fork and exec is such a copy of this process (with
                # torch mapped where pytest has imported it), vLLM's engine core before its
                # setproctitle one of the API server (a second server to a scan in that window,
                # likely on a loaded machine), a worker one of the engine core.
                if self._unfinished_fork(proc):
                    continue
                kind = vllm_process(proc)
                if kind is not None:
                    self.seen.add(proc.pid)
                    self.started.append(kind)
                    try:
                        shared = os.getsid(proc.pid) in _allowed_sessions
                    except OSError:
                        shared = False
                    if not (self.may_start_vllm or shared):
                        self._violation(proc, f"vLLM started ({kind}): mark it `engine`, or use the shared "
                                              "`server` fixture if it only sends requests")
                    elif not shared and self._over_budget(kind):
                        self._violation(proc, f"vLLM started ({kind}) beyond the test's declared "
                                              f"engines={self.engines_allowed}: share a server, or declare "
                                              "what the test needs and say why")
                elif not self.may_run_py312 and runs_py312(proc):
                    self.seen.add(proc.pid)
                    self._violation(proc, "a process of the Python 3.12 venv started: mark it `py312` "
                                          "(`make check` builds no second Python)")
                elif not self.may_load_torch and loads_torch(proc):
                    self.seen.add(proc.pid)
                    self._violation(proc, "a process that loads torch started: mark it `slow` (or "
                                          "`server`/`engine` if that is what it needs)")

    @staticmethod
    def _unfinished_fork(proc: psutil.Process) -> bool:
        """A child with its parent's command line: a fork that has not exec'd or retitled yet."""
        try:
            parent = proc.parent()
            return parent is not None and parent.cmdline() == proc.cmdline()
        except psutil.Error:
            return True  # gone, or not readable yet: looked at again next time

    def _over_budget(self, kind: str) -> bool:
        counted = "vllm serve" if kind == "vllm serve" else "engine core" if kind.startswith(f"{VLLM_TITLE}EngineCore") else None
        if counted is None:
            return False
        self.counts[counted] += 1
        return self.counts[counted] > self.engines_allowed

    def _violation(self, proc: psutil.Process, what: str) -> None:
        try:
            command = " ".join(proc.cmdline())[:200]
        except psutil.Error:
            command = "?"
        self.violations.append(f"{what} (pid {proc.pid}, killed: {command})")
        kill_tree(proc)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()
        self.scan()


def available_mib() -> int:
    """The host's available memory (what it can give without swapping): a run that nears 0 slows
    down everywhere as the kernel drops the pages of running programs."""
    return psutil.virtual_memory().available // 2**20


def kill_tree(proc: psutil.Process) -> None:
    try:
        procs = [*proc.children(recursive=True), proc]
    except psutil.Error:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


def engines_declared(item: pytest.Item) -> int | None:
    """The `engines=N` of an `engine` test's marker (None when missing or not a positive int)."""
    value = item.get_closest_marker("engine").kwargs.get("engines")
    return value if isinstance(value, int) and value > 0 else None


def shared_groups(items: list[pytest.Item]) -> dict[str, str]:
    """Shared server fixture -> its pytest-xdist group. Under `make test`'s workers (--dist
    loadgroup) the tests of one shared server run on one worker, so that it starts once per run,
    not once per worker; different shared servers' tests may run on different workers (the suite
    balances better), unless one test uses several: those share a group."""
    group = {name: {name} for name in SHARED_SERVERS}
    for item in items:
        used = SHARED_SERVERS & set(getattr(item, "fixturenames", ()))
        merged = set().union(*(group[name] for name in used))
        for name in merged:
            group[name] = merged
    return {name: SHARED_GROUP + "+".join(sorted(members)) for name, members in group.items()}


def apply_xdist_group(item: pytest.Item, group: str) -> None:
    """Make an `xdist_group` mark hold. pytest-xdist 3.8.0 tells its scheduler an item's group by
    appending "@group" to the item's `_nodeid`, which pytest 9.2 no longer reads (its ids are `_id`):
    the group is then silently ignored (pytest-xdist #1386; the fix, #1388, is not released).
    Appended here to the id pytest reads, before xdist's hook runs (tryfirst below);
    tests/test_tiers.py shows the grouping."""
    if getattr(item.config.option, "loadgroup", False) and "@" not in item.nodeid.rpartition("]")[2]:
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(f"{item.nodeid}@{group}")


def xdist_group(item: pytest.Item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    return None if mark is None else mark.args[0] if mark.args else mark.kwargs.get("name", "default")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (its hook appends them to the ids)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    problems = []
    groups = config.stash[GROUPS] = shared_groups(items)
    for item in items:
        marked = {m for m in MARKERS if item.get_closest_marker(m) is not None}
        if "engine" in marked and engines_declared(item) is None:
            problems.append(f"{item.nodeid}: marked `engine` without `engines=N` (a positive int): declare how "
                            "many vLLM engine cores it starts at most")
        fixtures = set(getattr(item, "fixturenames", ()))
        shared = sorted(SHARED_SERVERS & fixtures)
        if shared:
            group = groups[shared[0]]
            item.add_marker(pytest.mark.xdist_group(group))
            apply_xdist_group(item, group)
        elif (group := xdist_group(item)) is not None:  # a test module's own group
            apply_xdist_group(item, group)
        if shared and "server" not in marked:
            problems.append(f"{item.nodeid}: uses the shared server fixture {shared[0]!r} but is not marked `server`")
        elif "server" in marked and not shared:
            problems.append(f"{item.nodeid}: marked `server` but uses no shared server fixture ({', '.join(sorted(SHARED_SERVERS))})")
        if "tiny_checkpoint" in fixtures and not marked:
            problems.append(f"{item.nodeid}: uses `tiny_checkpoint` (torch-generated weights) unmarked: use "
                            "`tiny_config` if its config, tokenizer or files are enough, else mark it `slow`")
    if problems:
        raise pytest.UsageError("test markers that do not tell the truth (tests/tiers.py):\n  "
                                + "\n  ".join(problems))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    item.stash[WATCH] = Watch(item)
    try:
        yield
    finally:
        item.stash[WATCH].stop()


@pytest.hookimpl(trylast=True)  # after pytest's own teardown of the test's fixtures; a failure is its teardown's
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop this worker's shared servers whose tests are all done, rather than at the session's end.
    Under `make test`'s workers (--dist loadgroup) a shared server's group reaches a worker as one
    batch (pytest-xdist 3.8.0's LoadScopeScheduling sends a group whole, a worker runs in order), so
    once the next test is not of its group, no test of this worker needs it again. Idle, a server
    holds ~2.9 GB (Pss: API server 0.9, engine core 0.5, worker 1.6 with its 1 GiB KV cache); kept to
    the end, up to three per worker stayed beside the tests that start three servers of their own:
    7 API servers and 310 MiB of 24 GiB available in one run, and a CI run whose overload test hung.
    Without workers (one process runs the tests in file order, a server's tests apart) nothing is
    stopped early. pytest has no public way to finish a fixture early: FixtureDef.finish is what
    pytest calls itself at the session's end (a later request would start the server again; its
    dependent fixtures are finished with it)."""
    if nextitem is None or not hasattr(item.config, "workerinput") or not getattr(item.config.option, "loadgroup", False):
        return
    groups = item.config.stash.get(GROUPS, {})
    for name in sorted(SHARED_SERVERS & set(item.fixturenames)):
        if xdist_group(nextitem) == groups.get(name):
            continue
        for fixturedef in item._fixtureinfo.name2fixturedefs.get(name, ()):
            fixturedef.finish(item._request)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    watch = item.stash.get(WATCH, None)
    if watch is None:
        return
    watch.scan()
    with watch.lock:
        violations, watch.violations = watch.violations, []
        started, watch.started = watch.started, []
    report = outcome.get_result()
    report.user_properties += [(STARTED, kind) for kind in started] + [(LEAST_AVAILABLE, watch.least_available_mib)]
    if violations:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid}, during its {call.when}: " + "; ".join(violations)
                           + " (the markers: tests/tiers.py)")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # In the process that reports: pytest's own, or pytest-xdist's controller for its workers.
    _started.extend((report.nodeid, kind) for key, kind in report.user_properties if key == STARTED)
    _least_available.extend((mib, report.nodeid) for key, mib in report.user_properties if key == LEAST_AVAILABLE)


def pytest_terminal_summary(terminalreporter) -> None:
    if hasattr(terminalreporter.config, "workerinput"):
        return  # a pytest-xdist worker: the controller prints the run's summary
    servers = sum(kind == "vllm serve" for _, kind in _started)
    engines = sum(kind.startswith(f"{VLLM_TITLE}EngineCore") for _, kind in _started)
    terminalreporter.section("vLLM started by this run")
    terminalreporter.write_line(f"{servers} API servers, {engines} engine cores" + (", by test:" if _started else ""))
    by_test: dict[str, list[str]] = {}
    for nodeid, kind in _started:
        by_test.setdefault(nodeid, []).append(kind)
    for nodeid, kinds in by_test.items():
        counts = {k: kinds.count(k) for k in dict.fromkeys(kinds)}
        terminalreporter.write_line(f"  {nodeid}: " + ", ".join(f"{n} x {k}" for k, n in counts.items()))
    if _least_available:
        mib, nodeid = min(_least_available)
        terminalreporter.write_line(f"least memory available while a test ran: {mib} MiB, during {nodeid} "
                                    "(and what the other workers ran then)")


WATCH = pytest.StashKey[Watch]()
GROUPS = pytest.StashKey[dict[str, str]]()  # shared server fixture -> its xdist group, from collection
