"""The generated parts of the docs, in one registry: each is Markdown between two marker lines,

    <!-- NAME:start (anything: where it comes from) -->
    ...generated...
    <!-- NAME:end -->

in one or more files, and made by one function that returns that Markdown. `make docs` writes them
all (`python scripts/doc_tables.py --write --all`; `--write NAME` one); tests/test_doc_tables.py
keeps each in sync, one test per entry. Adding a generated part: a function returning its
Markdown, the markers in the file(s), one line in TABLES.

A generator is named "module:function" and imported only when its table is made, so that this
module imports none of them: two are made from the tests' data (tests/support/bad_config.py and
bad_requests.py: the same cases the tests send, kept with the tests and importable as `support`
where pytest runs, through pyproject.toml's pytest `pythonpath`), and the patch table from
scripts/patch_table.py, which runs the plugin in every target's venv (`needs`: not made by the
sync test; each venv's column is checked in that venv, see TABLES). A checkout's script, not part
of the installed package: run as a command, it puts tests/ and scripts/ on its path for those (the
same folders as pytest's `pythonpath`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import pathlib
import sys
from collections.abc import Sequence

REPO = pathlib.Path(__file__).resolve().parents[1]  # scripts/doc_tables.py
# Where the generators outside the package live (a checkout's folders; pytest's pythonpath too).
GENERATOR_PATHS = ("tests", "scripts")


@dataclasses.dataclass(frozen=True)
class Table:
    name: str  # the marker: <!-- NAME:start ... --> ... <!-- NAME:end -->
    files: tuple[str, ...]  # relative to the repository
    generator: str  # "module:function", the function returning the Markdown between the markers
    needs: str = ""  # what making it needs beyond .venv; such a table is not made by the sync test

    def generate(self) -> str:
        module, _, function = self.generator.partition(":")
        text = getattr(importlib.import_module(module), function)()
        return text if text.endswith("\n") else text + "\n"


TABLES: tuple[Table, ...] = (
    Table("settings-table", ("docs/configuration.md",), "minicpmv_ascend.settings.docs:markdown_table"),
    Table("features-table", ("docs/applications.md",), "minicpmv_ascend.tools.features:markdown"),
    Table("targets-table", ("docs/deploy-ascend.md",), "doc_tables:targets_markdown"),
    Table("access-tables", ("docs/reliability.md",), "minicpmv_ascend.server.access:markdown"),
    Table("advisories", ("docs/reliability.md",), "minicpmv_ascend.tools.advisories:markdown"),
    Table("observability-rows", ("docs/observability.md",), "minicpmv_ascend.tools.observability:rows_markdown"),
    Table("observability-alerts", ("docs/observability.md",), "minicpmv_ascend.tools.observability:alerts_markdown"),
    Table("observability-metrics", ("docs/observability.md",), "minicpmv_ascend.tools.observability:metrics_markdown"),
    Table("bad-config-table", ("docs/reliability.md",), "support.bad_config:markdown_table"),
    Table("bad-requests", ("docs/reliability.md",), "support.bad_requests:markdown_table"),
    # Each column from one venv's plugin decisions: plugin/tests/core/test_register.py checks each target's
    # column in its venv, tests/test_plugin_targets.py the CPU column and the rows (`make patch-table`).
    Table("patch-table", ("plugin/README.md",),
          "doc_tables:patch_table_markdown", needs="the target venvs (make patch-table)"),
    # plugin/README.md's per-patch prose, from each patch's declaration (no target venv needed).
    Table("patch-list", ("plugin/README.md",), "patch_table:patch_list"),
)


def targets_markdown() -> str:
    from minicpmv_ascend.tools import targets

    return targets.markdown(targets.load(None))


def patch_table_markdown() -> str:
    """scripts/patch_table.py's table, rendered from every target venv's and .venv's decisions."""
    import patch_table  # scripts/

    return patch_table.render([patch_table.run_decisions(venv) for venv in patch_table.venvs()])


def by_name(name: str) -> Table:
    for table in TABLES:
        if table.name == name:
            return table
    raise KeyError(f"no generated table {name!r}; the registry has: {', '.join(t.name for t in TABLES)}")


def _bounds(text: str, name: str) -> tuple[int, int]:
    """Where the generated part of `text` starts (after the start marker's line) and ends (at the
    end marker)."""
    start_mark, end_mark = f"<!-- {name}:start", f"<!-- {name}:end -->"
    if text.count(start_mark) != 1 or text.count(end_mark) != 1:
        raise ValueError(f"want one {start_mark} ... --> line and one {end_mark}, found "
                         f"{text.count(start_mark)} and {text.count(end_mark)}")
    start = text.index("\n", text.index(start_mark)) + 1
    end = text.index(end_mark)
    if end < start:
        raise ValueError(f"{end_mark} comes before {start_mark}")
    return start, end


def section(text: str, name: str) -> str:
    """The generated part of `text` named `name`, as it stands."""
    start, end = _bounds(text, name)
    return text[start:end]


def replace(text: str, name: str, body: str) -> str:
    """`text` with the generated part named `name` replaced by `body`."""
    start, end = _bounds(text, name)
    return text[:start] + body + text[end:]


def write(tables: Sequence[Table], check: bool = False) -> list[str]:
    """Make each table and write it into its files (`check`: write nothing); the files that were
    (or, with `check`, would be) changed."""
    changed = []
    for table in tables:
        body = table.generate()
        for name in table.files:
            path = REPO / name
            text = path.read_text(encoding="utf-8")
            new = replace(text, table.name, body)
            if new != text:
                changed.append(f"{name} ({table.name})")
                if not check:
                    path.write_text(new, encoding="utf-8")
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/doc_tables.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="tables to make (default: every one that needs only .venv)")
    parser.add_argument("--all", action="store_true", help="every table, those with `needs` too (`make docs`)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="write the tables into their files")
    mode.add_argument("--check", action="store_true", help="exit 1 if a file is out of date")
    mode.add_argument("--list", action="store_true", help="list the registry")
    args = parser.parse_args(argv)
    if args.list:
        for table in TABLES:
            print(f"{table.name:18} {', '.join(table.files)}  <- {table.generator}"
                  + (f"  (needs {table.needs})" if table.needs else ""))
        return 0
    for folder in reversed(GENERATOR_PATHS):  # a checkout's tests/ and scripts/, as under pytest
        if str(REPO / folder) not in sys.path:
            sys.path.insert(0, str(REPO / folder))
    tables = [by_name(name) for name in args.names] or [t for t in TABLES if args.all or not t.needs]
    changed = write(tables, check=not args.write)
    if changed:
        print(("rewrote: " if args.write else "out of date (run `make docs`): ") + "; ".join(changed),
              file=sys.stdout if args.write else sys.stderr)
        return 0 if args.write else 1
    print("up to date: " + ", ".join(t.name for t in tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
