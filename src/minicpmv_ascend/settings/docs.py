"""The configuration reference: the Markdown table docs/configuration.md embeds
(`python -m minicpmv_ascend.settings --markdown`; tests/test_doc_tables.py keeps it in sync, through
the registry in scripts/doc_tables.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from minicpmv_ascend.server import access
from minicpmv_ascend.settings.plan import setting_argv
from minicpmv_ascend.settings.table import SETTINGS, Setting
from minicpmv_ascend.settings.types import describe_type


def _doc_flag(setting: Setting) -> str:
    if setting.emit == "positional":
        return "`MODEL` (positional)"
    if setting.emit == "env":
        # Both API-key settings end up in vLLM's environment, never on its command line.
        where = f"env `{'VLLM_API_KEY' if setting.name.startswith('api_key') else setting.env}` of vLLM"
        return where + (f" and `--middleware {setting.middleware}`" if setting.middleware else "")
    if setting.emit == "middleware":
        on = access.middleware_path(True).rpartition(".")[2]
        return f"`--middleware {access.middleware_path(False)}` (true: `.{on}`)"
    if setting.emit == "launcher":
        return "- (launcher only)"
    if setting.emit == "bool":
        flags = " / ".join(f"`{flag}`" for flag in (setting_argv(setting, True)[0], *setting_argv(setting, False)))
        return flags + (f" (true: also `--middleware {setting.middleware}`)" if setting.middleware else "")
    return f"`{setting.flag}`"


def markdown_table() -> str:
    """The configuration reference (docs/configuration.md embeds it verbatim)."""
    rows = ["| YAML key | env var | vLLM flag | type | default | description |",
            "|---|---|---|---|---|---|"]
    for s in SETTINGS:
        default = s.display(s.default)
        default_cell = f"`{default}`" if default else "(empty)"
        help_text = s.help + (" **Secret**: shown as `<redacted>`." if s.secret else "")
        rows.append(f"| `{s.name}` | `{s.env}` | {_doc_flag(s)} | {describe_type(s.type)} "
                    f"| {default_cell} | {help_text} |".replace("->", "→"))
    return "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minicpmv_ascend.settings", description="MiniCPM-V 4.6 serving settings")
    parser.add_argument("--markdown", action="store_true", help="print the configuration reference table")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(markdown_table())
        return 0
    parser.print_help()
    return 0
