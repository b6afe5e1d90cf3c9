"""The configuration reference: the Markdown table docs/configuration.md embeds
(`python -m minicpmv_ascend.settings --markdown`; tests/test_doc_tables.py keeps it in sync, through
the registry in scripts/doc_tables.py): per setting its YAML key, env var, default and one line of
meaning, the first sentence of its help text in table.py (each help text starts with that line, so the
meaning is declared once). The whole help text, type and vLLM flag of each:
`python -m minicpmv_ascend.settings --describe`.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

from minicpmv_ascend.server import access
from minicpmv_ascend.settings.plan import setting_argv
from minicpmv_ascend.settings.table import SETTINGS, Setting
from minicpmv_ascend.settings.types import describe_type

# A sentence ends at a full stop followed by a space (or the end of the text), unless the stop
# ends "e.g." or "i.e." or lies inside a `code span`; the next sentence may start in lower case
# ("auto: ...", "false: ..."), as many help texts' second sentences do.
_SENTENCE_END = re.compile(r"`[^`]*`|(?<!e\.g)(?<!i\.e)\.(?=\s|$)")
# The longest first sentence a help text may have: one table cell (tests/test_settings.py checks each).
BRIEF_MAX_CHARS = 150


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


def brief(setting: Setting) -> str:
    """One line of meaning: the help text's first sentence (each help text starts with one)."""
    for match in _SENTENCE_END.finditer(setting.help):
        if match.group() == ".":
            return setting.help[:match.end()]
    return setting.help


def markdown_table() -> str:
    """The configuration reference (docs/configuration.md embeds it verbatim)."""
    rows = ["| YAML key | env var | default | meaning |", "|---|---|---|---|"]
    for s in SETTINGS:
        default = s.display(s.default)
        default_cell = f"`{default}`" if default else "(empty)"
        rows.append(f"| `{s.name}` | `{s.env}` | {default_cell} | {brief(s)}{' Secret.' if s.secret else ''} |"
                    .replace("->", "→"))
    return "\n".join(rows) + "\n"


def describe(names: Sequence[str] = ()) -> str:
    """Each setting (or the named ones) in full: key, env var, vLLM flag, type, default, help text."""
    out = []
    for s in SETTINGS:
        if names and s.name not in names and s.env not in names:
            continue
        secret = " Secret: shown as <redacted>." if s.secret else ""
        out.append(f"{s.name} (env {s.env}; vLLM: {_doc_flag(s).replace('`', '')})\n"
                   f"  type: {describe_type(s.type)}; default: {s.display(s.default) or '(empty)'}\n"
                   f"  {s.help}{secret}\n")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minicpmv_ascend.settings", description="MiniCPM-V 4.6 serving settings")
    parser.add_argument("--markdown", action="store_true", help="print the configuration reference table")
    parser.add_argument("--describe", nargs="*", metavar="KEY",
                        help="print every setting (or the named keys or env vars) in full: flag, type, help")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(markdown_table())
        return 0
    if args.describe is not None:
        unknown = [n for n in args.describe if n not in {x for s in SETTINGS for x in (s.name, s.env)}]
        if unknown:
            parser.error(f"no such setting: {', '.join(unknown)}")
        sys.stdout.write(describe(args.describe))
        return 0
    parser.print_help()
    return 0
