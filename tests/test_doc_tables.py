"""Every generated part of the docs is what its generator makes now: one test per entry of the
registry (scripts/doc_tables.py; `make docs` rewrites them), and the registry's marker
handling itself. The patch table needs the target venvs to be made: its columns are checked in each
venv instead (tests/test_plugin_targets.py, plugin/tests/core/test_register.py).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import doc_tables
from support.server import REPO, clean_env

MADE_HERE = [t for t in doc_tables.TABLES if not t.needs]


@pytest.mark.parametrize("table", MADE_HERE, ids=[t.name for t in MADE_HERE])
def test_each_generated_doc_table_is_what_its_generator_makes(table: doc_tables.Table) -> None:
    body = table.generate()
    assert body.strip(), f"{table.generator} made nothing"
    for name in table.files:
        text = (REPO / name).read_text(encoding="utf-8")
        assert doc_tables.section(text, table.name) == body, f"{name}'s {table.name} is stale: run `make docs`"


def test_every_generated_part_of_the_docs_is_in_the_registry() -> None:
    """A `<!-- NAME:start` marker in a doc whose NAME the registry lacks would never be rewritten."""
    registered = {(t.name, f) for t in doc_tables.TABLES for f in t.files}
    found = set()
    for path in [REPO / "README.md", REPO / "plugin" / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("<!-- ") and ":start" in line.split()[1]:
                found.add((line.split()[1].removesuffix(":start"), str(path.relative_to(REPO))))
    assert found == registered


def test_marker_replacement_keeps_the_markers_and_the_text_around_them() -> None:
    text = "before\n<!-- t:start (from here) -->\nold\n<!-- t:end -->\nafter\n"
    new = doc_tables.replace(text, "t", "| a |\n")
    assert new == "before\n<!-- t:start (from here) -->\n| a |\n<!-- t:end -->\nafter\n"
    assert doc_tables.section(new, "t") == "| a |\n"
    for broken in ("<!-- t:start -->\nno end\n", text + text, "<!-- t:end -->\n<!-- t:start -->\n"):
        with pytest.raises(ValueError):
            doc_tables.section(broken, "t")


def test_doc_tables_check_passes_and_names_no_file() -> None:
    """`python scripts/doc_tables.py --check` (what `make docs` writes) finds nothing
    to change, from a plain process outside pytest (its own path to tests/support)."""
    proc = subprocess.run([sys.executable, "scripts/doc_tables.py", "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=clean_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("up to date: ") and "bad-requests" in proc.stdout, proc.stdout
