"""What a request body may be before vLLM parses it: at most `max_request_body_mb`, no string the
engine cannot encode, and nothing by which one client reaches another's requests.

Why: vLLM (0.23, 0.30, 0.32) reads a body of any size into memory and parses it (a 30 MB body of
whitespace is parsed and served). And JSON can spell a lone UTF-16 surrogate (`"\\ud800"`, valid
JSON, not valid Unicode text): Python keeps it in the `str`, and vLLM fails only when the string
is encoded, far from where it came in: `stop`, `bad_words`, `vllm_xargs`, `chat_template_kwargs`
(and any other field that reaches the engine or the tokenizer) give `500 InternalServerError` with
an empty message (`UnicodeEncodeError ... surrogates not allowed` in `vllm/v1/serial_utils.py`, or
`TypeError: TextEncodeInput` in the tokenizer), streamed as a 200 whose stream carries the error.

How: `RequestGuard` is a dependency-free ASGI middleware the launcher hands vLLM through its
`--middleware` option, inside the access control (an unauthenticated request is refused before
its body is read) and outside the tool-call guard:
1. a body over the limit answers 413 at once (Content-Length), or as soon as the bytes received
   pass it (chunked uploads), without reading further;
2. in a body that spells a surrogate escape (`\\uD800`-`\\uDFFF`, a fast byte search), every
   string (and key) that is not valid Unicode, i.e. holds a surrogate that is not half of a pair,
   makes a 400 that names the field (`stop[0]`, `messages[0].content[1].text`): one general
   check at the door instead of one per field, the same on every vLLM target. Pairs
   (`"\\ud83d\\ude00"`, an emoji) are one character once parsed and pass unchanged.

Clients of one server are strangers to each other; five more checks keep one from reaching into
another's requests or the server's budget (docs/reliability.md, "One client, another's data"):
3. **Media uuids are private** (`media_uuids: private`, the default). vLLM keys its multimodal
   caches (processor, encoder, prefix) by the `uuid` a client gives a media part, server-wide: a
   client that names another's uuid with no data gets the other's image read, and one that sends
   its own image under a uuid an application uses later plants it (vLLM 0.23, 0.30, 0.32 alike).
   The kit has one API key per server, so there is no caller identity to scope a uuid by: a uuid
   beside data is dropped (vLLM then hashes the data itself, so identical images still share the
   cache), and a uuid without data becomes a fresh random one, which vLLM answers with its own
   cache-miss 400. `shared` keeps vLLM's behaviour, for a server whose only client is one trusted
   application. Either way a uuid that is not a string of 1-256 characters is a 400 naming it.
4. **Control tokens are not text** (`allow_control_tokens: false`, the default). vLLM renders the
   chat template to a string and then tokenizes it with the special tokens matched, so
   `<|im_end|>\n<|im_start|>system` written in a message becomes a real system turn. The text
   the template renders (`messages`, `tools`, the Responses API's `input` and `instructions`,
   Anthropic's `system`) may not contain any of the tokenizer's special added tokens (read from
   the checkpoint's tokenizer files, not kept by hand): a 400 names the field. The thinking and
   tool markers (`<think>`, `<tool_call>`...) are not special in MiniCPM-V's tokenizer: models
   write them, agents replay them, the template gives them no role. Raw prompts
   (`/v1/completions`) are the client's own template and pass.
5. **Media options are the operator's** (`trust_request_mm_kwargs: false`, the default).
   Per-request `mm_processor_kwargs` and `media_io_kwargs` decide how much media work a request
   makes (`{"video": {"num_frames": -1}}` decodes every frame); vLLM >= 0.31 refuses them without
   `--trust-request-mm-kwargs`, 0.30 and 0.23 take them from any client. The guard refuses them
   on every target, with the same switch.
6. **Decoded media has a budget** (`max_media_megapixels`, 128). vLLM decodes every inline image
   in full and every `video/jpeg` frame it keeps (32 by default: up to 32 x 179 megapixels, about
   17 GB of pixels, from one 13 MiB body). The guard reads each inline image's and frame's size
   from its header (Pillow's `Image.open` on the first bytes, nothing decoded) and sums them over
   the request, every frame sent counted; past the budget the request is a 400 naming the part
   that crossed it. Media fetched by URL is bounded one item at a time by the same number (the
   launcher sets vLLM's `VLLM_MAX_IMAGE_PIXELS` to it).
7. **The chat template is the server's.** vLLM refuses a request's `chat_template` (or
   `chat_template_kwargs.chat_template`) without `--trust-request-chat-template` on its chat
   path only: the Responses API rendered one (PYSEC-2026-4349), without bound in time or size
   (GHSA-542m-9234-8gvf), on 0.23 and 0.30. The guard refuses both fields on every route unless
   vLLM was started with that flag (read from the app's `state.args`, as vLLM does).
Every JSON body is parsed for these (a 26 MiB image body: 0.05-0.13 s, about what searching it
for the keys and tokens would cost: base64 spells `uuid` about once in 20 MiB). A body the guard
does not refuse is handed on byte for byte, unless a uuid was rewritten (3).
"""

from __future__ import annotations

import binascii
import io
import json
import logging
import os
import pathlib
import re
import secrets
import warnings
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any, Literal

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MIDDLEWARE = f"{__name__}.RequestGuard"
LIMIT_ENV = "MAX_REQUEST_BODY_MB"
# 160 MiB: five images at OpenAI's 20 MiB limit, base64-encoded (x 4/3: 134 MiB), plus the rest of
# a request; no honest request is larger (limit_mm_per_prompt allows 5 images), and a server that
# reads at most this much per request cannot be made to hold gigabytes by one client.
DEFAULT_LIMIT_MB = 160
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")

MEDIA_UUIDS_ENV = "MEDIA_UUIDS"
MediaUuids = Literal["private", "shared"]
CONTROL_TOKENS_ENV = "ALLOW_CONTROL_TOKENS"
MM_KWARGS_ENV = "TRUST_REQUEST_MM_KWARGS"
MM_KWARGS_FIELDS = ("mm_processor_kwargs", "media_io_kwargs")
UUID_MAX_CHARS = 256
PIXELS_ENV = "MAX_MEDIA_MEGAPIXELS"
# 128 megapixels (384 MiB as RGB): five 25-megapixel photos, or 32 video frames of 2560x1440;
# the model reads each image as a few 448x448 slices, so more pixels only cost memory and time.
DEFAULT_MEGAPIXELS = 128
# Base64 characters decoded to read an image's header: PNG's is in the first 33 bytes, JPEG's
# frame header follows its metadata (EXIF with a thumbnail: tens of KiB); past this, all of it.
HEADER_CHARS = 128 * 1024
# Where media parts (and so uuids) are: chat messages (chat, /tokenize, /invocations, Anthropic's
# /v1/messages), the Responses API's input, vLLM's token-in generate route.
MEDIA_FIELDS = ("messages", "input", "content_parts")
# What a chat template renders into the prompt as text.
RENDERED_FIELDS = ("messages", "tools", "input", "instructions", "system")
_log = logging.getLogger(__name__)


def _positive_int_from_env(name: str, default: int) -> int:
    """A positive integer the launcher set in the environment; `default` where it is unset or not one."""
    configured = os.environ.get(name, "").strip()
    return int(configured) if configured.isdigit() and int(configured) > 0 else default


def limit_from_env() -> int:
    """The body limit in bytes (MAX_REQUEST_BODY_MB, the launcher sets it)."""
    return _positive_int_from_env(LIMIT_ENV, DEFAULT_LIMIT_MB) * 1024 * 1024


def media_uuids_from_env() -> MediaUuids:
    """MEDIA_UUIDS (the launcher sets it): `shared`, else `private`."""
    return "shared" if os.environ.get(MEDIA_UUIDS_ENV, "").strip().lower() == "shared" else "private"


def megapixels_from_env() -> int:
    """The decoded-pixel budget per request, in megapixels (MAX_MEDIA_MEGAPIXELS, the launcher sets it)."""
    return _positive_int_from_env(PIXELS_ENV, DEFAULT_MEGAPIXELS)


def _flag_from_env(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def control_tokens_allowed_from_env() -> bool:
    """ALLOW_CONTROL_TOKENS (the launcher sets it)."""
    return _flag_from_env(CONTROL_TOKENS_ENV)


def mm_kwargs_trusted_from_env() -> bool:
    """TRUST_REQUEST_MM_KWARGS (the launcher sets it)."""
    return _flag_from_env(MM_KWARGS_ENV)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def unencodable_fields(value: Any, path: str = "") -> list[str]:
    """The paths of the strings (and keys) in a parsed JSON value that are not valid Unicode."""
    found: list[str] = []
    if isinstance(value, str):
        if not _encodable(value):
            found.append(path or "(the body)")
    elif isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if not _encodable(key):
                found.append(f"{path or '(the body)'} (a key)")
                where = f"{path}.<key>" if path else "<key>"
            found.extend(unencodable_fields(item, where))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found.extend(unencodable_fields(item, f"{path}[{i}]"))
    return found


def surrogate_problem(parsed: Any) -> tuple[str, str] | None:
    """(field, message) when a parsed body holds text the engine cannot encode, else None."""
    fields = unencodable_fields(parsed)
    if not fields:
        return None  # only surrogate pairs: valid text
    return fields[0], (
        f"`{fields[0]}` holds a lone UTF-16 surrogate (an escape such as \\ud800 that is not half of a "
        f"pair), which is not Unicode text and cannot be encoded"
        + (f" (also in {', '.join(f'`{f}`' for f in fields[1:4])})" if len(fields) > 1 else "")
        + "; send valid UTF-8 text: a character outside the Basic Multilingual Plane is either the "
        "character itself or both halves of its surrogate pair (\\ud83d\\ude00)")


def _nodes(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(path, node) for a JSON value and everything inside it, paths as `a[0].b`."""
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _nodes(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _nodes(item, f"{path}[{i}]")


def _has_media(part: dict[str, Any]) -> bool:
    """Whether a media part carries its data (a URL, base64, embeddings), not only a uuid."""
    for key, value in part.items():
        if key in ("type", "uuid", "detail") or value is None:
            continue
        if not isinstance(value, dict) or any(v is not None for v in value.values()):
            return True
    return False


def uuid_problem(parsed: dict[str, Any], mode: MediaUuids) -> tuple[tuple[str, str] | None, bool]:
    """Checks every media part's uuid and, in private mode, rewrites it in place (module
    docstring, 3): ((field, message) for a malformed one or None, whether anything was rewritten)."""
    rewritten = False
    for field in MEDIA_FIELDS:
        for path, node in _nodes(parsed.get(field), field):
            if not isinstance(node, dict) or "uuid" not in node:
                continue
            uuid = node["uuid"]
            if uuid is None:
                continue  # vLLM's own "no uuid"
            if not isinstance(uuid, str) or not 1 <= len(uuid) <= UUID_MAX_CHARS:
                return (f"{path}.uuid", (
                    f"`{path}.uuid` must be a string of 1 to {UUID_MAX_CHARS} characters (it names the "
                    f"media item for the server's cache); got {type(uuid).__name__}"
                    + (f" of {len(uuid)} characters" if isinstance(uuid, str) else "")
                    + "; send the media's data, and a short string as uuid or none")), rewritten
            if mode == "private":
                rewritten = True
                if _has_media(node):
                    del node["uuid"]
                else:  # a uuid alone: a cache miss for vLLM, whoever used that uuid before
                    node["uuid"] = f"private-{secrets.token_hex(16)}"
    return None, rewritten


def mm_kwargs_problem(parsed: dict[str, Any]) -> tuple[str, str] | None:
    """(field, message) for per-request media options (module docstring, 5)."""
    field = next((name for name in MM_KWARGS_FIELDS if parsed.get(name)), None)
    if field is None:
        return None
    return field, (f"per-request `{field}` are refused unless the server runs with --trust-request-mm-kwargs "
                   f"({MM_KWARGS_ENV}=true): they change how media is loaded and processed (how images are "
                   "sliced, how many video frames are decoded), which one client must not decide for a shared "
                   "server. Leave them out; only an operator whose clients are all trusted turns them on")


def image_pixels(encoded: str) -> int | None:
    """Width x height from the header of a base64 image, nothing decoded; None where it is not one
    Pillow reads (vLLM answers that with its own 400). Past Pillow's decompression-bomb limit: more
    than the limit (Pillow refuses to say how much)."""
    from PIL import Image

    for chars in (encoded[:HEADER_CHARS // 4 * 4], encoded) if len(encoded) > HEADER_CHARS else (encoded,):
        try:
            with warnings.catch_warnings():  # the budget, not Pillow's warning, decides
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                with Image.open(io.BytesIO(binascii.a2b_base64(chars))) as image:
                    return image.width * image.height
        except Image.DecompressionBombError:
            return 2 * (Image.MAX_IMAGE_PIXELS or 0) + 1
        except (binascii.Error, OSError, ValueError, SyntaxError):
            continue
    return None


def inline_media(parsed: dict[str, Any]) -> Iterator[tuple[str, str, list[str]]]:
    """(path, media type, base64 items) for each medium sent inline: data: URLs (chat parts, the
    Responses API's `image_url` string) and Anthropic's base64 `source`; a `video/jpeg` data URL is
    its frames. Text parts are text, whatever they spell."""
    for field in MEDIA_FIELDS:
        for path, node in _nodes(parsed.get(field), field):
            if isinstance(node, dict) and node.get("type") == "base64" and isinstance(node.get("data"), str):
                yield f"{path}.data", str(node.get("media_type") or ""), [node["data"]]
            elif isinstance(node, str) and node[:5].lower() == "data:" and not path.endswith(".text"):
                spec, _, data = node[5:].partition(",")
                media_type = spec.split(";")[0].lower()
                yield path, media_type, data.split(",") if media_type == "video/jpeg" else [data]


def pixels_problem(parsed: dict[str, Any], budget_megapixels: int) -> tuple[str, str] | None:
    """(field, message) for the part whose inline media take the request past its decoded-pixel
    budget (module docstring, 6)."""
    total = 0
    for path, media_type, items in inline_media(parsed):
        if not (media_type.startswith("image/") or media_type == "video/jpeg"):
            continue  # other video formats: vLLM's loader bounds them by its frame count
        total += sum(image_pixels(item) or 0 for item in items)
        if total > budget_megapixels * 1_000_000:
            what = f"{len(items)} frames" if media_type == "video/jpeg" else "images"
            return path, (f"`{path}`: the media this request sends decode to more than this server's budget of "
                          f"{budget_megapixels} megapixels per request ({PIXELS_ENV}): {total / 1e6:.0f} megapixels "
                          f"up to and including these {what}, every frame sent counted. Send smaller images or "
                          "fewer frames: the model reads each image as a few 448x448 slices, so larger ones only "
                          "cost the server memory")
    return None


def chat_template_problem(parsed: dict[str, Any]) -> tuple[str, str] | None:
    """(field, message) for a request's own chat template (module docstring, 7)."""
    kwargs = parsed.get("chat_template_kwargs")
    field = ("chat_template" if parsed.get("chat_template") is not None
             else "chat_template_kwargs.chat_template"
             if isinstance(kwargs, dict) and kwargs.get("chat_template") is not None else None)
    if field is None:
        return None
    return field, (f"`{field}`: a chat template is passed with the request, but this server renders its "
                   "model's own template (vLLM's --trust-request-chat-template is not set). Leave it out")


def read_special_tokens(model_dir: pathlib.Path) -> frozenset[str]:
    """The tokenizer's special added tokens: tokenizer.json's `added_tokens` and
    tokenizer_config.json's `added_tokens_decoder` whose `special` is true."""
    tokens: set[str] = set()
    for name, key in (("tokenizer.json", "added_tokens"), ("tokenizer_config.json", "added_tokens_decoder")):
        try:
            entries = json.loads((model_dir / name).read_text(encoding="utf-8")).get(key) or []
        except (OSError, ValueError):
            continue
        for entry in entries.values() if isinstance(entries, dict) else entries:
            if isinstance(entry, dict) and entry.get("special") and entry.get("content"):
                tokens.add(entry["content"])
    return frozenset(tokens)


def control_token_problem(parsed: dict[str, Any], pattern: re.Pattern[str] | None) -> tuple[str, str] | None:
    """(field, message) for the first rendered text that holds a special token (module docstring, 4)."""
    if pattern is None:
        return None
    for field in RENDERED_FIELDS:
        for path, node in _nodes(parsed.get(field), field):
            if isinstance(node, str) and (found := pattern.search(node)):
                return path, (
                    f"`{path}` contains `{found.group()}`, one of the model's control tokens: written in "
                    "text it would act as chat-template markup (a new turn, a media placeholder), so "
                    "this server refuses it; remove it or write it differently (e.g. with a space "
                    f"inside). An operator whose clients are all trusted may set {CONTROL_TOKENS_ENV}=true")
    return None


def check_body(body: bytes, media_uuids: MediaUuids = "private", control_tokens: re.Pattern[str] | None = None,
               mm_kwargs_trusted: bool = False, chat_templates_trusted: bool = False,
               budget_megapixels: int = DEFAULT_MEGAPIXELS) -> tuple[tuple[str, str] | None, bytes]:
    """((field, message) or None, the body to hand on): the checks of the module docstring.
    `control_tokens`: the special tokens to refuse in rendered text (`token_pattern`), None: none."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None, body  # not JSON, or nested past Python's parser: vLLM answers it (400)
    if SURROGATE_ESCAPE.search(body) and (problem := surrogate_problem(parsed)):
        return problem, body
    if not isinstance(parsed, dict):
        return None, body
    problem = (None if mm_kwargs_trusted else mm_kwargs_problem(parsed)) or (
        None if chat_templates_trusted else chat_template_problem(parsed))
    if problem:
        return problem, body
    problem, rewritten = uuid_problem(parsed, media_uuids)
    problem = problem or control_token_problem(parsed, control_tokens) or pixels_problem(parsed, budget_megapixels)
    if problem or not rewritten:
        return problem, body
    return None, json.dumps(parsed, ensure_ascii=False).encode()


def token_pattern(tokens: frozenset[str]) -> re.Pattern[str] | None:
    """One pattern for the tokens, longest first (one that is a prefix of another loses); None when empty."""
    return re.compile("|".join(map(re.escape, sorted(tokens, key=lambda t: (-len(t), t))))) if tokens else None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def _send_error(send: Send, status: int, kind: str, message: str, param: str | None) -> None:
    data = json.dumps({"error": {"message": message, "type": kind, "param": param, "code": status}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": data})


class RequestGuard:
    """The ASGI middleware (module docstring)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], limit: int | None = None,
                 media_uuids: MediaUuids | None = None, control_tokens: frozenset[str] | None = None,
                 mm_kwargs_trusted: bool | None = None, budget_megapixels: int | None = None) -> None:
        self.app = app
        self.limit = limit if limit is not None else limit_from_env()
        self.budget_megapixels = budget_megapixels or megapixels_from_env()
        self.media_uuids = media_uuids or media_uuids_from_env()
        self.mm_kwargs_trusted = mm_kwargs_trusted_from_env() if mm_kwargs_trusted is None else mm_kwargs_trusted
        # control_tokens None: the served checkpoint's, read at the first request (unless allowed)
        self._control_tokens = token_pattern(control_tokens) if control_tokens is not None else None
        self._control_tokens_known = control_tokens is not None or control_tokens_allowed_from_env()

    def control_token_pattern(self, scope: Scope) -> re.Pattern[str] | None:
        """The special tokens of the checkpoint vLLM serves (`--tokenizer`, else the model: the
        app's `state.args`), read once; None where control tokens are allowed."""
        if not self._control_tokens_known:
            self._control_tokens_known = True
            args = getattr(getattr(scope.get("app"), "state", None), "args", None)
            where = getattr(args, "tokenizer", None) or getattr(args, "model", None) or ""
            tokens = read_special_tokens(pathlib.Path(where)) if where else frozenset()
            if not tokens:
                _log.error("no special tokens found in the tokenizer files of %r: control tokens in "
                           "message text are not refused", where)
            self._control_tokens = token_pattern(tokens)
        return self._control_tokens

    def _too_large(self) -> str:
        return (f"the request body is larger than this server accepts ({self.limit // (1024 * 1024)} MiB, "
                f"{LIMIT_ENV}); send fewer or smaller images, or fetch them by URL")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        length = _header(scope, b"content-length")
        if length and length.strip().isdigit() and int(length) > self.limit:
            await _send_error(send, 413, "RequestEntityTooLarge", self._too_large(), None)
            return
        messages: list[Message] = []
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            part = message.get("body", b"")
            size += len(part)
            if size > self.limit:
                await _send_error(send, 413, "RequestEntityTooLarge", self._too_large(), None)
                return
            parts.append(part)
            if not message.get("more_body", False):
                break
        body = b"".join(parts)
        args = getattr(getattr(scope.get("app"), "state", None), "args", None)
        problem, checked = check_body(body, self.media_uuids, self.control_token_pattern(scope), self.mm_kwargs_trusted,
                                      bool(getattr(args, "trust_request_chat_template", False)),
                                      self.budget_megapixels)
        if problem is not None:
            await _send_error(send, 400, "BadRequestError", problem[1], problem[0])
            return
        if checked is not body:  # rewritten: one message, and the length it now has
            messages = [{"type": "http.request", "body": checked, "more_body": False}]
            scope = dict(scope, headers=[(k, v) for k, v in scope.get("headers") or () if k.lower() != b"content-length"]
                         + [(b"content-length", str(len(checked)).encode())])
        pending = iter(messages)

        async def replay() -> Message:
            return next(pending, None) or await receive()

        await self.app(scope, replay, send)
