"""Health probes for the vLLM OpenAI-compatible server: live, ready and a text+image smoke test.

    minicpmv-probe live|ready|smoke [options]      (or: python healthcheck/probe.py ...)

- live:  GET /health answers 200 (the engine is alive; vLLM answers 503 after engine death).
- ready: live, and GET /v1/models lists the served model name.
- smoke: real chat completions: a text prompt, an image prompt with a PNG the probe draws itself
  (so it works in a cluster without internet), and, when a reasoning parser is expected, a
  thinking-off prompt. Checks the OpenAI response shape, token accounting, that the image reached
  the model (more prompt tokens than text alone) and that reasoning is separated from content.
  Optional answer checks (--expect-*-answer REGEX) are meant for real weights.

Exit status: 0 healthy, 1 unhealthy (one-line reason on stderr), 2 usage/configuration error.

Only the standard library is used on purpose: orchestrators run this every few seconds, so it must
start fast and work in any Python of the image without extra packages. It also runs on the hosts'
Python: 3.7 or newer (Kylin V10 and EulerOS ship 3.7), so no syntax or library call newer than 3.7.
"""

from __future__ import annotations

import argparse
import base64
import functools
import json
import os
import re
import struct
import sys
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from minicpmv_ascend.common.api_key import ApiKeyError, api_key_from_env
from minicpmv_ascend.common.http import Client, RequestFailed, parse_json

EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE = 0, 1, 2
# SERVED_MODEL_NAME unset or `auto` (the launcher's default: the checkpoint's model decides the
# name): the probe takes the one model /v1/models lists.
AUTO_MODEL = "auto"
DEFAULT_TIMEOUT = {"live": 10.0, "ready": 10.0, "smoke": 60.0}
TEXT_QUESTION = "What is 2+3? Answer with a number."
IMAGE_QUESTION = "What colour is the square?"
FINISH_REASONS = frozenset({"stop", "length"})
THINK_TAGS = ("<think>", "</think>")
# The probe's own picture: a red square on a white canvas, wider than tall because a square
# image would hide any width/height swap in the image processing path.
PNG_SIZE = (96, 64)
SQUARE_BOX = (28, 12, 68, 52)  # left, top, right, bottom (exclusive)
WHITE, RED = (255, 255, 255), (220, 30, 30)


class ProbeFailure(Exception):
    """A check failed; the message is the one-line reason shown to the operator. (A request that
    got no answer is the client's RequestFailed, reported the same way.)"""


class UsageError(Exception):
    """Bad options or environment (exit 2)."""


# --------------------------------------------------------------------------------------------
# The image


def png_bytes(width: int, height: int, pixel: Callable[[int, int], tuple[int, int, int]]) -> bytes:
    """Encode an 8-bit RGB PNG (filter type 0 on every row) with zlib and struct only."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    rows = b"".join(
        b"\x00" + b"".join(bytes(pixel(x, y)) for x in range(width)) for y in range(height)
    )
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit, truecolour
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows, 9))
        + chunk(b"IEND", b"")
    )


def square_png() -> bytes:
    """The probe's picture: a red square on white, 96x64."""
    left, top, right, bottom = SQUARE_BOX

    def pixel(x: int, y: int) -> tuple[int, int, int]:
        return RED if left <= x < right and top <= y < bottom else WHITE

    return png_bytes(*PNG_SIZE, pixel)


def png_data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


# --------------------------------------------------------------------------------------------
# Checks


@dataclass
class CheckResult:
    name: str
    ok: bool
    latency_ms: float
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


def check_health(client: Client) -> dict[str, Any]:
    status, _ = client.get("/health")
    if status != 200:  # urllib raises for >= 400; a 2xx/3xx other than 200 is still wrong here
        raise ProbeFailure(f"GET /health: HTTP {status}, expected 200")
    return {"status": status}


def served_models(client: Client) -> list[str]:
    _, body = client.get("/v1/models")
    listing = parse_json(body, "GET /v1/models")
    data = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(data, list):
        raise ProbeFailure("GET /v1/models: missing field 'data' (not an OpenAI model list)")
    return [str(entry.get("id")) for entry in data if isinstance(entry, dict)]


def check_models(client: Client, model: str) -> dict[str, Any]:
    served = served_models(client)
    if model == AUTO_MODEL:
        if len(served) != 1:
            raise ProbeFailure(f"GET /v1/models: {len(served)} models served ({', '.join(served) or 'none'}); "
                               "name the one to probe with --model or SERVED_MODEL_NAME")
    elif model not in served:
        raise ProbeFailure(
            f"GET /v1/models: model {model!r} is not served (served: {', '.join(served) or 'none'})"
        )
    return {"served": served}


@dataclass(frozen=True)
class ChatCase:
    """One smoke request. thinking=None leaves the chat template's default (thinking on)."""

    name: str
    with_image: bool
    thinking: bool | None
    max_tokens: int
    answer: re.Pattern[str] | None = None


def chat_payload(case: ChatCase, model: str, image_url: str) -> dict[str, Any]:
    question = IMAGE_QUESTION if case.with_image else TEXT_QUESTION
    content: str | list[dict[str, Any]] = question
    if case.with_image:
        content = [
            {"type": "image_url", "image_url": {"url": image_url}},
            {"type": "text", "text": question},
        ]
    payload: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": case.max_tokens,
        "temperature": 0,
    }
    if case.thinking is not None:
        payload["chat_template_kwargs"] = {"enable_thinking": case.thinking}
    return payload


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ProbeFailure(message)


def _field(obj: Any, path: str) -> Any:
    """obj[key] for the last part of a dotted path, which names the field in the error."""
    key = path.rsplit(".", 1)[-1]
    _require(isinstance(obj, dict) and key in obj, f"missing field '{path}' in the response")
    return obj[key]


def reasoning_of(message: dict[str, Any]) -> str | None:
    """The thinking of an answer. Every vLLM the kit runs (0.23, 0.30, 0.32) serves it as `reasoning`
    only (vLLM renamed `reasoning_content` in vllm-project/vllm#27752 and removed it in #33402);
    `reasoning_content` is still read for a proxy in front of the server that renames it."""
    value = message.get("reasoning")
    return value if value is not None else message.get("reasoning_content")


def validate_completion(response: Any, case: ChatCase) -> dict[str, Any]:
    """Check the OpenAI chat.completion shape and token accounting; return the useful parts."""
    _require(isinstance(_field(response, "id"), str), "field 'id' is not a string")
    kind = _field(response, "object")
    _require(kind == "chat.completion", f"field 'object' is {kind!r}, expected 'chat.completion'")
    choices = _field(response, "choices")
    _require(isinstance(choices, list) and len(choices) > 0, "field 'choices' is empty")
    message = _field(choices[0], "choices[0].message")
    _require(_field(message, "choices[0].message.role") == "assistant",
             "choices[0].message.role is not 'assistant'")
    finish = _field(choices[0], "choices[0].finish_reason")
    _require(finish in FINISH_REASONS, f"finish_reason is {finish!r}, expected stop or length")
    usage = _field(response, "usage")
    counts = {k: _field(usage, f"usage.{k}")
              for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    _require(all(isinstance(v, int) and v >= 0 for v in counts.values()),
             f"usage counts are not non-negative integers: {counts}")
    _require(counts["prompt_tokens"] > 0, "usage.prompt_tokens is 0")
    _require(counts["total_tokens"] == counts["prompt_tokens"] + counts["completion_tokens"],
             f"usage.total_tokens != prompt_tokens + completion_tokens: {counts}")
    completion = counts["completion_tokens"]
    _require(completion <= case.max_tokens,
             f"usage.completion_tokens={completion} > max_tokens={case.max_tokens}")
    _require(finish != "length" or counts["completion_tokens"] > 0,
             "finish_reason is 'length' but usage.completion_tokens is 0")
    details = usage.get("completion_tokens_details")
    return {
        "finish_reason": finish,
        **counts,
        # A vLLM extension when a reasoning parser runs; None elsewhere.
        "reasoning_tokens": details.get("reasoning_tokens") if isinstance(details, dict) else None,
        "content": message.get("content"),
        "reasoning": reasoning_of(message),
    }


def validate_reasoning(result: dict[str, Any], case: ChatCase) -> None:
    """With a reasoning parser, thinking output must land in `reasoning`, never in `content`."""
    content, reasoning = result["content"] or "", result["reasoning"] or ""
    if case.thinking is False:
        _require(not reasoning,
                 f"thinking is off but 'reasoning' is not empty ({len(reasoning)} chars)")
        _require(bool(content), "thinking is off but 'content' is empty")
        return
    # The template opens <think>, so the first generated tokens are reasoning.
    _require(bool(reasoning),
             "no 'reasoning' in the message: is the server started with --reasoning-parser?")
    _require(not any(tag in content for tag in THINK_TAGS),
             "think tags leaked into 'content': the reasoning parser did not separate them")
    ran_out_thinking = (result["finish_reason"] == "length"
                        and result["reasoning_tokens"] == result["completion_tokens"])
    _require(not (ran_out_thinking and content),
             "all tokens were reasoning tokens but 'content' is not empty")


def run_chat(client: Client, case: ChatCase, model: str, image_url: str,
             expect_reasoning: bool) -> dict[str, Any]:
    response = client.post_json("/v1/chat/completions", chat_payload(case, model, image_url))
    result = validate_completion(response, case)
    if expect_reasoning:
        validate_reasoning(result, case)
    if case.answer is not None:
        answer = result["content"] or ""
        _require(case.answer.search(answer) is not None,
                 f"answer {_preview(answer)!r} does not match /{case.answer.pattern}/")
    # Keep the report small: lengths and a preview, not the whole generation.
    content, reasoning = result.pop("content") or "", result.pop("reasoning") or ""
    result.update(content_chars=len(content), reasoning_chars=len(reasoning),
                  content_preview=_preview(content))
    return result


def _preview(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def smoke_cases(options: argparse.Namespace) -> list[ChatCase]:
    """Text and image with the server's default (thinking on); thinking off when a reasoning
    parser is expected or answers are checked (a thinking model answers directly only then, so
    answers are checked there, with a larger token budget)."""
    cases = [
        ChatCase("text", with_image=False, thinking=None, max_tokens=options.max_tokens),
        ChatCase("image", with_image=True, thinking=None, max_tokens=options.max_tokens),
    ]
    text_answer, image_answer = options.expect_text_answer, options.expect_image_answer
    if options.expect_reasoning or text_answer:
        budget = options.answer_max_tokens if text_answer else options.max_tokens
        name = "text_answer" if text_answer else "thinking_off"
        cases.append(ChatCase(name, False, False, budget, text_answer))
    if image_answer:
        cases.append(ChatCase("image_answer", True, False, options.answer_max_tokens, image_answer))
    return cases


def cross_check(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The image must have been turned into tokens: the image prompt is longer than the text one
    (the questions have similar lengths; even a small image is dozens of tokens)."""
    text, image = results["text"]["prompt_tokens"], results["image"]["prompt_tokens"]
    if image <= text:
        raise ProbeFailure(
            f"image prompt_tokens={image} not above the text prompt's {text}: image was dropped?"
        )
    return {"image_prompt_tokens": image, "text_prompt_tokens": text}


# --------------------------------------------------------------------------------------------
# Running a mode


@dataclass
class Report:
    mode: str
    url: str
    model: str
    ok: bool = True
    error: str | None = None
    latency_ms: float = 0.0
    checks: list[CheckResult] = field(default_factory=list)

    def run(self, name: str, check: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run one check, record it, and stop the mode at the first failure (later checks would
        only repeat the same error, multiplying the time an unhealthy server costs)."""
        start = time.perf_counter()
        try:
            details = check()
        except (ProbeFailure, RequestFailed) as exc:
            reason = f"{name}: {exc}"  # the check's name tells the operator which step failed
            self._record(CheckResult(name, False, _ms_since(start), reason))
            raise ProbeFailure(reason) from exc
        self._record(CheckResult(name, True, _ms_since(start), None, details))
        return details

    def _record(self, result: CheckResult) -> None:
        self.checks.append(result)
        self.latency_ms = round(self.latency_ms + result.latency_ms, 1)


def _ms_since(start: float) -> float:
    return round((time.perf_counter() - start) * 1000, 1)


def run_mode(options: argparse.Namespace, client: Client, report: Report) -> None:
    model = options.model
    if options.mode in ("live", "ready"):
        report.run("health", lambda: check_health(client))
    if options.mode == "ready":
        report.run("models", lambda: check_models(client, model))
    if options.mode == "smoke":
        if model == AUTO_MODEL:
            model = report.run("models", lambda: check_models(client, model))["served"][0]
        image_url = png_data_url(square_png())
        results: dict[str, dict[str, Any]] = {}
        for case in smoke_cases(options):
            check = functools.partial(run_chat, client, case, model, image_url,
                                      options.expect_reasoning)
            results[case.name] = report.run(case.name, check)
            if case.name == "image":
                report.run("image_tokens", lambda: cross_check(results))


# --------------------------------------------------------------------------------------------
# Command line


def _regex(value: str) -> re.Pattern[str]:
    try:
        return re.compile(value)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"invalid regular expression {value!r}: {exc}") from exc


def _positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(value: str) -> int | float:
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a {kind.__name__}") from None
        if number <= 0:
            raise argparse.ArgumentTypeError(f"{value!r} must be > 0")
        return number

    return parse


def _default_url(env: Mapping[str, str]) -> str:
    port = env.get("PORT", "8000")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"PORT={port!r} is not a TCP port number (1-65535)")
    return f"http://127.0.0.1:{port}"


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help="server root, e.g. http://127.0.0.1:8000 "
                        "(default: http://127.0.0.1:$PORT, PORT defaults to 8000)")
    common.add_argument("--model", default=os.environ.get("SERVED_MODEL_NAME") or AUTO_MODEL,
                        help="served model name (default: $SERVED_MODEL_NAME, else auto: the one model "
                        "/v1/models lists)")
    common.add_argument("--timeout", type=_positive(float),
                        help="seconds per request (default: 10 for live/ready, 60 for smoke)")
    common.add_argument("--json", action="store_true",
                        help="print one JSON report on stdout")
    parser = argparse.ArgumentParser(
        prog="minicpmv-probe",
        description="Probe a vLLM OpenAI-compatible server. API key: $VLLM_API_KEY or the file "
        "named by $API_KEY_FILE. Exit 0 healthy, 1 unhealthy, 2 usage error.",
    )
    # Smoke-only options, so that the other modes see the same namespace.
    parser.set_defaults(expect_reasoning=False, expect_text_answer=None, expect_image_answer=None,
                        max_tokens=16, answer_max_tokens=64)
    modes = parser.add_subparsers(dest="mode", required=True, metavar="{live,ready,smoke}")
    modes.add_parser("live", parents=[common], help="GET /health is 200")
    modes.add_parser("ready", parents=[common], help="live, and /v1/models lists the model")
    smoke = modes.add_parser("smoke", parents=[common],
                             help="a text and an image chat completion, checked")
    # (argparse.BooleanOptionalAction is Python 3.9+: the two flags by hand.)
    smoke.add_argument("--expect-reasoning", dest="expect_reasoning", action="store_true",
                       default=True,
                       help="the server runs a reasoning parser: check that thinking goes to "
                       "'reasoning' and thinking-off has none (default: on)")
    smoke.add_argument("--no-expect-reasoning", dest="expect_reasoning", action="store_false",
                       help="the server runs without a reasoning parser")
    smoke.add_argument("--max-tokens", type=_positive(int), default=16,
                       help="max_tokens of the shape checks (default: %(default)s)")
    smoke.add_argument("--expect-text-answer", type=_regex, metavar="REGEX",
                       help=f"regex the thinking-off answer to {TEXT_QUESTION!r} must match")
    smoke.add_argument("--expect-image-answer", type=_regex, metavar="REGEX",
                       help=f"regex the thinking-off answer to {IMAGE_QUESTION!r} about the "
                       "probe's red square must match")
    smoke.add_argument("--answer-max-tokens", type=_positive(int), default=64,
                       help="max_tokens of the answer checks (default: %(default)s)")
    return parser


def parse_options(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = build_parser()
    options = parser.parse_args(argv)
    try:
        url = options.url or _default_url(os.environ)
    except UsageError as exc:
        parser.error(str(exc))
    # Accept an OpenAI base URL too: clients are configured with .../v1, the probe wants the root.
    url = url.rstrip("/")
    options.url = url[:-len("/v1")] if url.endswith("/v1") else url  # (str.removesuffix: 3.9+)
    if not options.url.startswith(("http://", "https://")):
        parser.error(f"--url {url!r} must start with http:// or https://")
    options.timeout = options.timeout or DEFAULT_TIMEOUT[options.mode]
    return options


def emit(report: Report, as_json: bool) -> None:
    if as_json:
        # ASCII-only JSON: model output may be any text, the probe's stdout encoding is unknown.
        print(json.dumps(asdict(report)))
    elif report.ok:
        timings = ", ".join(f"{c.name} {c.latency_ms:g} ms" for c in report.checks)
        print(f"{report.mode} ok: {timings}")
    if not report.ok:
        reason = " ".join(str(report.error).split())  # one line, whatever the server said
        print(f"{report.mode} FAILED ({report.url}): {reason}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_options(argv)
    try:
        api_key = api_key_from_env(os.environ)
    except ApiKeyError as exc:
        print(f"minicpmv-probe: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    client = Client(options.url, options.timeout, api_key, user_agent="minicpmv-probe")
    report = Report(options.mode, options.url, options.model)
    try:
        run_mode(options, client, report)
    except ProbeFailure as exc:
        report.ok, report.error = False, str(exc)
    emit(report, options.json)
    return EXIT_OK if report.ok else EXIT_UNHEALTHY


if __name__ == "__main__":
    sys.exit(main())
