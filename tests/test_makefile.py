"""The Makefile on a stock machine: the Python it picks (or the message when there is none) and the
pip command lines it builds for the locks' CPU torch, read with `make -n` (nothing is installed).

What cannot run here: PyTorch's CPU wheel index is unreachable from this machine, so the torch
step falls back to the local wheel (PIP_FIND_LINKS) after pip's retries; the index itself is
exercised only where it can be reached.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from support.deploy import DOCKERFILES, build_args, dockerfile_instructions
from support.server import REPO

MAKE = shutil.which("make") or "/usr/bin/make"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TORCH_PIN = "\"$(grep -m1 '^torch==' requirements/cpu.lock)\""


def make_n(*args: str, path: str | None = None, cwd: pathlib.Path = REPO, **env: str) -> subprocess.CompletedProcess:
    """`make -n -B ARGS` in the checkout (or `cwd`): the commands make would run, all of them, none run."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "TORCH_INDEX_URL", "MAKEFLAGS")}
    environ.update(env)
    if path is not None:
        environ["PATH"] = path
    return subprocess.run([MAKE, "-n", "-B", *args], cwd=cwd, env=environ, capture_output=True, text=True,
                          timeout=60)


def pip_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if "pip install" in line]


def fake_bin(tmp_path: pathlib.Path, **pythons: str) -> str:
    """A PATH of the shell tools make needs plus only the given python commands (name -> target)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("bash", "sh", "grep", "test", "echo", "rm", "touch", "env"):
        if found := shutil.which(tool):
            (bin_dir / tool).symlink_to(found)
    for name, target in pythons.items():
        if target.startswith("#!"):
            (bin_dir / name).write_text(target)
            (bin_dir / name).chmod(0o755)
        else:
            (bin_dir / name).symlink_to(target)
    return str(bin_dir)


def pyenv_python(version: str) -> str:
    found = sorted(pathlib.Path.home().glob(f".pyenv/versions/{version}*/bin/python{version}"))
    if not found:
        pytest.skip(f"no Python {version} here (pyenv)")
    return str(found[-1])


# --------------------------------------------------------------------------------------------
# torch from PyTorch's CPU wheel index, everything else from the default index
# --------------------------------------------------------------------------------------------


def test_torch_comes_from_the_cpu_index_and_only_torch() -> None:
    result = make_n("venv")
    assert result.returncode == 0, result.stderr
    torch_step, lock_step = pip_lines(result.stdout)[:2]
    assert torch_step.endswith(f"--no-deps --extra-index-url {CPU_INDEX} {TORCH_PIN}"), torch_step
    # The whole lock without the extra index: asked for ~160 packages, an unreachable index costs
    # pip's retries for each one (measured ~8 s per package here), torch alone ~9 s.
    assert lock_step.endswith("--no-deps -r requirements/cpu.lock") and "index" not in lock_step, lock_step
    pin = re.search(r"^torch==\S+$", (REPO / "requirements" / "cpu.lock").read_text(), re.M)
    assert pin and pin[0].endswith("+cpu"), "the grep finds the lock's torch pin, a CPU build"


def test_the_index_is_overridable_or_off() -> None:
    mirror = make_n("venv", TORCH_INDEX_URL="https://mirror.example/whl/cpu")
    assert "--extra-index-url https://mirror.example/whl/cpu " in pip_lines(mirror.stdout)[0]
    off = make_n("venv", "TORCH_INDEX_URL=")
    assert "extra-index-url" not in off.stdout and f"--no-deps {TORCH_PIN}" in pip_lines(off.stdout)[0]


def test_every_venv_built_from_a_lock_with_cpu_torch_takes_torch_from_the_index() -> None:
    targets = re.search(r"^PLUGIN_TARGETS := (.+)$", (REPO / "Makefile").read_text(), re.M)[1].split()
    assert targets, "no plugin target venvs in the Makefile"
    for target, lock in [(f"venv-{t}", f"requirements/{t}.lock") for t in targets] + [("lock", "requirements/cpu.in")]:
        assert "torch==2.13.0+cpu" in (REPO / lock).read_text(), lock
        steps = pip_lines(make_n(target).stdout)
        # A derived target's torch is the first target's venv's (their locks differ only in vllm).
        torch_from = lock if target in ("lock", f"venv-{targets[0]}") else f"requirements/{targets[0]}.lock"
        assert f"--extra-index-url {CPU_INDEX} \"$(grep -m1 '^torch==' {torch_from})\"" in steps[0], (target, steps)


def test_a_target_whose_lock_differs_only_in_vllm_is_the_first_targets_venv_with_its_vllm(tmp_path) -> None:
    """vllm023.lock is vllm030.lock but for vllm: .venv-vllm023 is a hard-linked copy of
    .venv-vllm030 with vLLM 0.23.0 swapped in (plugin/tests/test_venv.py shows the result is exactly
    its lock). A lock that differs in any other package is installed whole."""
    first, second = re.search(r"^PLUGIN_TARGETS := (.+)$", (REPO / "Makefile").read_text(), re.M)[1].split()
    vllm_pin = f"\"$(grep -m1 '^vllm==' requirements/{second}.lock)\""
    derived = make_n(f"venv-{second}").stdout
    assert f"cp -al .venv-{first} .venv-{second}" in derived, derived
    assert pip_lines(derived)[-1].endswith(f"-m pip install --quiet --no-deps {vllm_pin}"), derived
    assert f"-r requirements/{second}.lock" not in derived
    # The same Makefile beside a second lock that pins another torch: installed from its lock.
    for name in ("Makefile", "pyproject.toml", "scripts/torchvision_cpu_shim.py", f"requirements/{first}.lock"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    lock = (REPO / "requirements" / f"{second}.lock").read_text()
    (tmp_path / "requirements" / f"{second}.lock").write_text(lock.replace("torch==2.13.0+cpu", "torch==2.12.0+cpu"))
    whole = make_n(f"venv-{second}", cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr
    assert "cp -al" not in whole.stdout and f"--no-deps -r requirements/{second}.lock" in whole.stdout, whole.stdout


def test_one_index_variable_for_make_the_cpu_image_and_compose() -> None:
    """The same variable name and default in the three places that install the CPU lock."""
    makefile = re.search(r"^TORCH_INDEX_URL \?= (\S+)$", (REPO / "Makefile").read_text(), re.M)[1]
    dockerfile = build_args(dockerfile_instructions(DOCKERFILES["cpu"]))["TORCH_INDEX_URL"]
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())["services"]["minicpmv-cpu"]["build"]["args"]
    assert makefile == dockerfile == CPU_INDEX
    assert compose["TORCH_INDEX_URL"] == f"${{TORCH_INDEX_URL:-{CPU_INDEX}}}"


# --------------------------------------------------------------------------------------------
# The developers' loop
# --------------------------------------------------------------------------------------------


def test_help_names_the_quick_start_and_the_fast_loop() -> None:
    result = subprocess.run([MAKE, "help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    commands = re.findall(r"make (\w+)", result.stdout)
    assert commands[:3] == ["serve", "test", "check"], result.stdout


def test_check_is_ruff_and_the_tests_with_no_tier_marker() -> None:
    """`make check` runs the lint gate and pytest deselecting every marker tests/tiers.py enforces."""
    import tiers

    steps = make_n("check").stdout.splitlines()
    pytest_step = next(line for line in steps if "-m pytest" in line)
    unit_tier = re.search(r'-m "([^"]+)"', pytest_step)[1]
    assert unit_tier == " and ".join(f"not {marker}" for marker in tiers.MARKERS), pytest_step
    assert "plugin/tests" not in pytest_step
    assert any("ruff check" in line for line in steps), steps


# --------------------------------------------------------------------------------------------
# The Python that builds the venvs
# --------------------------------------------------------------------------------------------


def test_python_311_is_preferred_then_312(tmp_path) -> None:
    both = fake_bin(tmp_path, **{"python3.11": pyenv_python("3.11"), "python3.12": pyenv_python("3.12")})
    assert "\npython3.11 -m venv .venv\n" in make_n("venv", path=both).stdout
    only_312 = fake_bin(tmp_path / "312", **{"python3.12": pyenv_python("3.12")})
    assert "\npython3.12 -m venv .venv\n" in make_n("venv", path=only_312).stdout


def test_python3_is_taken_when_it_is_312_like_ubuntu_2404(tmp_path) -> None:
    path = fake_bin(tmp_path, python3=pyenv_python("3.12"))
    assert "\npython3 -m venv .venv\n" in make_n("venv", path=path).stdout


def test_a_pyenv_shim_of_a_missing_version_is_skipped(tmp_path) -> None:
    """pyenv puts python3.11/python3.12 shims on PATH even when that version is not installed."""
    shim = "#!/bin/sh\necho \"pyenv: python3.11: command not found\" >&2\nexit 127\n"
    path = fake_bin(tmp_path, **{"python3.11": shim, "python3.12": pyenv_python("3.12")})
    assert "\npython3.12 -m venv .venv\n" in make_n("venv", path=path).stdout


@pytest.mark.parametrize("given", [None, "python3"])
def test_without_311_or_312_it_stops_and_says_how_to_get_one(tmp_path, given) -> None:
    """Debian 13: python3 is 3.13. The venv is not attempted; the message names the way out."""
    path = fake_bin(tmp_path, python3=pyenv_python("3.13"))
    args = ["venv"] + ([f"PYTHON={given}"] if given else [])
    # The real recipe (not -n), in a copy of what it reads: its first line stops make before a venv.
    work = tmp_path / "checkout"
    work.mkdir()
    shutil.copy(REPO / "Makefile", work / "Makefile")
    for name in ("requirements/cpu.lock", "pyproject.toml", "scripts/torchvision_cpu_shim.py"):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, work / name)
    result = subprocess.run([MAKE, *args], cwd=work, env={"PATH": path, "HOME": str(tmp_path)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "needs Python 3.11 or 3.12" in result.stderr
    assert ("PYTHON=python3 is not one" if given else "found none of python3.11, python3.12") in result.stderr
    assert "uv python install 3.12" in result.stderr and "python3.12-venv" in result.stderr
    assert not (work / ".venv").exists()


# Stands in for .venv's python in `make test`: the main suite fails; the container phase (`-m
# container`) writes two step times, one failed, to the file CONTAINER_STEPS names, and passes.
PYTEST_STAND_IN = """import os, sys
if "container" not in sys.argv:
    sys.exit(1)
with open(os.environ["CONTAINER_STEPS"], "a") as out:
    out.write("engine\\t1\\tok\\nCPU image build\\t207\\tfailed\\n")
"""


def test_make_test_prints_every_phase_with_its_seconds_and_failures(tmp_path) -> None:
    """`make test` times each phase and prints the table at the end, a failed phase with its exit
    status and the container phase's steps under it; here with no setup and no target, ruff
    replaced by `true` and pytest by a stand-in."""
    stand_in = tmp_path / "python"
    stand_in.write_text(f"#!{sys.executable}\n{PYTEST_STAND_IN}")
    stand_in.chmod(0o755)
    environ = {k: v for k, v in os.environ.items() if k != "MAKEFLAGS"}
    result = subprocess.run([MAKE, "--no-print-directory", "test", "TEST_SETUP=", "PLUGIN_TARGETS=", "RUFF=true",
                             f"VPY={stand_in}", f"TEST_TIMES={tmp_path / 'times'}"],
                            cwd=REPO, env=environ, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0, result.stdout
    table = result.stdout[result.stdout.index("== make test phases"):].splitlines()[1:]
    assert [line.split()[0] for line in table] == ["ruff", "tests/", "containers", "engine", "CPU", "total"], table
    assert re.fullmatch(r"ruff +\d+ s", table[0]) and re.fullmatch(r"tests/ +\d+ s  exit 1", table[1]), table
    assert re.fullmatch(r"containers +\d+ s", table[2]), table
    assert table[3:5] == ["  engine                     1 s", "  CPU image build          207 s  failed"], table
    assert re.fullmatch(r"total +\d+ s  exit 1", table[5]), table


# `lost` kills the shell that runs it, before that shell writes the step's exit status (as a full disk
# would stop it writing).
SETUP_STAND_IN = """import os, sys, time
time.sleep(2)
if sys.argv[1] == "lost":
    os.kill(os.getppid(), 9)
sys.exit(3 if sys.argv[1] == "bad" else 0)
"""


@pytest.mark.slow  # runs make test's setup phase: stand-in steps of 2 s each, side by side (~3 s)
def test_make_test_runs_its_setup_steps_side_by_side_and_stops_after_a_failed_one(tmp_path) -> None:
    """The setup steps (a stand-in for `make STEP` that takes 2 s; `bad` fails, `lost` leaves no
    status) run at once: each is timed and its log printed, a failed one with its exit status (1 and
    a line that says so when it wrote none), and the tests do not run."""
    stand_in = tmp_path / "setup.py"
    stand_in.write_text(SETUP_STAND_IN)
    environ = {k: v for k, v in os.environ.items() if k != "MAKEFLAGS"}
    result = subprocess.run([MAKE, "--no-print-directory", "test", "TEST_SETUP=one lost bad three", "PLUGIN_TARGETS=",
                             f"SETUP_MAKE=python3 {stand_in}", f"TEST_TIMES={tmp_path / 'times'}", "RUFF=false"],
                            cwd=REPO, env=environ, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "Error 3" in result.stderr, result.stdout + result.stderr
    table = result.stdout[result.stdout.index("== make test phases"):].splitlines()[1:]
    rows = [re.fullmatch(r"(.+?) +(\d+) s(  exit (\d+))?", line).group(1, 2, 4) for line in table]
    assert [(name, code) for name, _, code in rows] == [
        ("make one", None), ("make lost", "1"), ("make bad", "3"), ("make three", None),
        ("setup, side by side", "3")], table
    assert 2 <= int(rows[4][1]) < 5, table  # side by side: about one step's 2 s, not three steps' 6 s
    assert [line for line in result.stdout.splitlines() if line.startswith("== make ")] == [
        "== make one", "== make lost", "== make lost wrote no exit status: killed, or no space left on device",
        "== make bad", "== make three", "== make test phases"]


def test_test_times_tables_each_file_and_the_slowest_tests(tmp_path) -> None:
    """scripts/test_times.py on a JUnit file like the ones make test writes: seconds per file,
    summed over its tests, largest first, then the slowest tests."""
    junit = tmp_path / "tests.xml"
    junit.write_text('<testsuites><testsuite name="pytest">'
                     '<testcase classname="tests.test_a" name="test_one" time="1.5"/>'
                     '<testcase classname="tests.test_b" name="test_two" time="7.25"/>'
                     '<testcase classname="tests.test_a" name="test_three" time="2.0"/>'
                     '</testsuite></testsuites>')
    out = subprocess.run(["python3", "scripts/test_times.py", str(junit), "--top", "1"], cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "### tests: 3 tests, 11 s" in out
    rows = [line for line in out.splitlines() if line.startswith("| tests/")]
    assert rows == ["| tests/test_b.py | 1 | 7 | 67 % |", "| tests/test_a.py | 2 | 4 | 33 % |",
                    "| tests/test_b::test_two | 7.2 |"], out


@pytest.mark.slow  # make test's CPU table: a recorder beside a process that burns, then idles (~4.5 s)
def test_cpu_by_process_records_a_busy_child_and_sums_it_by_kind(tmp_path) -> None:
    """scripts/cpu_by_process.py beside a process that burns 1.5 CPU-seconds (then idles, so that a
    poll sees all of it): `record` keeps its CPU time and command line until SIGTERM, `report` puts
    it under its kind. Interpreters by path: a pyenv shim's own processes would carry the same argv.
    The busy process is a fork that execs after 0.6 s: polls that see it first still see its
    parent's command line (as a loaded machine's polls see a fork before its exec)."""
    out = tmp_path / "cpu.json"
    recorder = subprocess.Popen([sys.executable, "scripts/cpu_by_process.py", "record", str(out), "--interval", "0.2"],
                                cwd=REPO)
    busy = ("import time; end = time.process_time() + 1.5\nwhile time.process_time() < end: pass\n"
            "time.sleep(1.5)  # cpu-by-process-test")
    try:
        time.sleep(0.5)  # the recorder has read its first /proc snapshot
        fork_then_exec = ("import os, sys, time\npid = os.fork()\nif pid == 0:\n    time.sleep(0.6)\n"
                          "    os.execv(sys.executable, [sys.executable, '-c', os.environ['BUSY']])\n"
                          "_, status = os.waitpid(pid, 0)\nsys.exit(os.waitstatus_to_exitcode(status))")
        subprocess.run([sys.executable, "-c", fork_then_exec], env={**os.environ, "BUSY": busy}, check=True, timeout=120)
    finally:
        recorder.send_signal(signal.SIGTERM)
        assert recorder.wait(30) == 0
    (child,) = [r for r in json.loads(out.read_text()).values() if "cpu-by-process-test" in r[1]]
    assert child[0] >= 1.4, child
    report = subprocess.run([sys.executable, "scripts/cpu_by_process.py", "report", str(out)], cwd=REPO,
                            capture_output=True, text=True, timeout=60, check=True).stdout
    row = next(line for line in report.splitlines() if line.startswith("| other python |"))
    assert float(row.split("|")[3]) >= child[0] - 0.5, report
