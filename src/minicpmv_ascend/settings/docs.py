"""The configuration reference: the Markdown table docs/configuration.md embeds
(`python -m minicpmv_ascend.settings --markdown`; tests/test_doc_tables.py keeps it in sync, through
the registry in scripts/doc_tables.py): per setting its YAML key, env var, default and one line of
meaning. The whole help text, type and vLLM flag of each: `python -m minicpmv_ascend.settings --describe`.
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

# The table's one line where the help text's first sentence is too long for it.
BRIEF = {
    "served_model_name": "Model name clients send in the `model` field; auto: the checkpoint's "
                         "(minicpm-v-4.6-thinking, minicpm-v-4.7).",
    "data_parallel_size": "Engines in this one server, behind one port; the kit recommends one server per NPU "
                          "instead (docs/deploy-ascend.md).",
    "max_num_seqs": "Most requests batched together, and the most sequences (`n`) one request may ask for "
                    "(past it: 400).",
    "compilation_config": "vLLM's compilation config (JSON object); Ascend decode graphs: "
                          "`{\"cudagraph_mode\":\"FULL_DECODE_ONLY\"}` with enforce_eager false.",
    "reasoning_parser": "Splits `<think>` output into the `reasoning` field; auto: `minicpmv` if this vLLM "
                        "has it, else `qwen3`; none: off.",
    "default_thinking": "Whether a request that does not set `chat_template_kwargs.enable_thinking` thinks; "
                        "auto: the model's default.",
    "mamba_ssm_cache_dtype": "Dtype of the Gated DeltaNet recurrent state; auto: the checkpoint's (float32).",
    "enable_auto_tool_choice": "Tool calling (`tools`, `tool_choice`), with the kit's tool-call guard "
                               "(docs/applications.md).",
    "tool_strict_level": "How far tool calls are constrained: parameter (arguments follow the schema), "
                         "function (the call's shape), auto (vLLM's default).",
    "shutdown_timeout": "Seconds in-flight requests may still run after SIGTERM; keep it below the "
                        "orchestrator's grace period.",
    "allowed_media_domains": "Which http(s) image URLs the server fetches: empty none, `public` (recommended), "
                             "listed hosts, `*` any (docs/reliability.md).",
    "media_url_fetches": "Most media URL fetches in flight, server-wide, in public mode; past it: 400.",
    "max_image_aspect_ratio": "Longest side / shortest side an image may have; past it: 400.",
    "allowed_local_media_path": "Server directory whose files clients may send as file:// URLs; empty: refused.",
    "max_request_body_mb": "Largest request body in MiB; a larger one gets 413 before it is read.",
    "media_uuids": "private: a media `uuid` never reaches another client's media; shared: vLLM's behaviour, "
                   "for one trusted client.",
    "allow_control_tokens": "Let message text contain the model's control tokens (chat-template markup); "
                            "false: 400.",
    "trust_request_mm_kwargs": "Accept per-request `mm_processor_kwargs` and `media_io_kwargs` from clients; "
                               "false: 400.",
    "max_media_megapixels": "Most pixels one request's media may decode to, in megapixels; past it: 400.",
    "api_key": "API key clients send as `Authorization: Bearer ...`; only in vLLM's environment.",
    "enable_admin_routes": "Serve vLLM's admin and scaling routes (with the API key); false: 403.",
}


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
    """One line of meaning: BRIEF's, else the help text's first sentence."""
    return BRIEF.get(setting.name) or re.split(r"(?<=\.)\s+(?=[A-Z0-9`])", setting.help, maxsplit=1)[0]


def markdown_table() -> str:
    """The configuration reference (docs/configuration.md embeds it verbatim)."""
    unknown = set(BRIEF) - {s.name for s in SETTINGS}
    assert not unknown, f"BRIEF names no setting: {sorted(unknown)}"
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
