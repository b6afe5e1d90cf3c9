"""The front door and the configuration page tell the truth: README.md's commands, and
docs/configuration.md's sample error and probe options (the generated tables: test_doc_tables.py;
links, anchors and the command blocks: test_docs.py)."""

from __future__ import annotations

import re
import subprocess
import sys

from support.server import REPO, clean_env

README = (REPO / "README.md").read_text()
CONFIGURATION = (REPO / "docs" / "configuration.md").read_text()


def test_sample_configuration_error_is_what_the_entrypoint_prints(tiny_config):
    sample = re.search(r"```text\n\$ MAX_MODEL_LEN=300000 python entrypoint.py\n(.*?)```", CONFIGURATION, re.S)
    assert sample, "the sample error block is missing from docs/configuration.md"
    result = subprocess.run(
        [sys.executable, "entrypoint.py"], cwd=REPO, capture_output=True, text=True, timeout=60,
        env=clean_env(MODEL_PATH=str(tiny_config), MAX_MODEL_LEN="300000"),
    )
    assert result.returncode == 2
    assert result.stderr.strip() == sample.group(1).strip()


def test_quick_start_commands_exist():
    makefile = (REPO / "Makefile").read_text()
    reliability = (REPO / "docs" / "reliability.md").read_text()
    for target, doc in (("serve", README), ("test", README), ("fuzz", reliability)):
        assert f"make {target}" in doc
        assert re.search(rf"^{target}:", makefile, re.M), f"Makefile has no {target} target"
    ci = (REPO / ".ci" / "run").read_text()
    assert "make test" in ci


def test_documented_probe_options_exist():
    help_text = subprocess.run([sys.executable, "healthcheck/probe.py", "smoke", "--help"], cwd=REPO,
                               capture_output=True, text=True, timeout=30).stdout
    section = CONFIGURATION[CONFIGURATION.index("## Health probes"):]
    for option in set(re.findall(r"`(--[a-z-]+)", section)):
        assert option in help_text, f"docs/configuration.md documents {option}, the probe does not have it"
