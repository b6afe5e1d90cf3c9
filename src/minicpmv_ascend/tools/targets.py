"""The Ascend targets (deploy/ascend-targets.yaml, the one table): load it, name a target's image,
render the "Targets" section of docs/deploy-ascend.md.

    python -m minicpmv_ascend.tools.targets --markdown    the table and its sources, as the docs embed them

The image carries a copy at /opt/minicpmv-ascend/build/ascend-targets.yaml (scripts/ascend_check.py).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

TABLE_IN_REPO = pathlib.Path(__file__).resolve().parents[3] / "deploy" / "ascend-targets.yaml"
BUILD_DIR_IN_IMAGE = pathlib.Path("/opt/minicpmv-ascend/build")
FACT_FIELDS = ("released", "cann", "hdk_min", "torch_npu", "python", "base_transformers")
OPEN = "open"


def load(path: str | pathlib.Path | None = None) -> dict[str, Any]:
    """The table: the repo's when running from a checkout, else the image's copy."""
    import yaml

    if path is None:
        path = TABLE_IN_REPO if TABLE_IN_REPO.is_file() else BUILD_DIR_IN_IMAGE / "ascend-targets.yaml"
    return yaml.safe_load(pathlib.Path(path).read_text(encoding="utf-8"))


def image_ref(table: dict[str, Any], tag: str, variant: str) -> str:
    """The official vllm-ascend image of a target and variant (a2, a3)."""
    return f"{table['image']}:{tag}{table['variants'][variant]}"


def fact(target: dict[str, Any], name: str) -> str:
    value = target.get(name)
    return OPEN if value is None else str(value)


def markdown(table: dict[str, Any]) -> str:
    """The targets table of the docs, then every fact's source, then what is still open."""
    variants = list(table["variants"])
    header = ["vllm-ascend", "images", "vLLM", "released", "CANN", "HDK (min)", "torch_npu", "Python",
              "transformers in the base", "transformers pin"]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for tag, target in table["targets"].items():
        name = f"**{tag}** (default)" if tag == table["default"] else tag
        images = "<br>".join(f"`{image_ref(table, tag, v)}` ({v})" for v in variants)
        cells = [name, images, target["vllm"], *(fact(target, f) for f in FACT_FIELDS), target["transformers_pin"]]
        rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines = rows + ["", "Sources:", ""]
    for tag, target in table["targets"].items():
        for field, source in target.get("sources", {}).items():
            lines.append(f"- {tag} `{field}`: {source}")
    for name, source in table.get("variant_sources", {}).items():
        lines.append(f"- image {name}: {source}")
    still_open = [f"{tag} `{field}`" for tag, target in table["targets"].items() for field in target.get("open", [])]
    lines += ["", "Open (no public source states them yet; `scripts/ascend_check.py` prints them from a "
              "running image, see the operator checklist): " + (", ".join(still_open) or "none") + "."]
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
