"""The vLLM security advisories an image scanner lists against the targets' vLLM releases, and for
each target (deploy/ascend-targets.yaml) whether its vLLM is in the published range and, if it is,
whether the kit's defaults reach the flaw and what stops it: ONE declaration, the source of
docs/reliability.md's table (`python -m minicpmv_ascend.tools.advisories --markdown`) and of
tests/test_advisories.py, which holds every entry to the targets table, the settings, the
plugin's patches and the tests it names.

Kept by hand from the advisories' own texts (GitHub advisories, CVE records, the PyPA advisory
database as shown by osv.dev); every range below is the one published, with its source. The list
holds the advisories that reach vLLM 0.23 or later and were found in those sources (November
2026); a scanner may list one that is missing here: add it, with its source. When a target's
vLLM changes (deploy/ascend-targets.yaml), re-check every entry: the test fails until each target
has a verdict that agrees with the published range.

A verdict for an affected target names how the kit's defaults stand (`Kind`):
  setting        a kit setting's default stops it (`setting` names it)
  guard          the request guard refuses the input (src/minicpmv_ascend/server/request_guard.py;
                 `setting` names the switch that turns the check off, if any)
  plugin         a patch of the kit's vLLM plugin fixes it (`plugin` names it: plugin/README.md)
  not reachable  the kit never enables what the flaw needs (the reason says what)
  open           reachable with the kit's defaults and nothing in the kit stops it (the reason says
                 what would fix it)
A mitigation names the tests (`file::function`) that show it. Dependency-free: importing this
module imports nothing of vLLM, torch or YAML (the table's header reads the targets table).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Mapping, Sequence
from typing import Literal

Status = Literal["affected", "not affected"]
Kind = Literal["setting", "guard", "plugin", "not reachable", "open"]
KINDS: tuple[Kind, ...] = ("setting", "guard", "plugin", "not reachable", "open")

T23, T30, T32 = "v0.23.0", "v0.30.0", "v0.32.0rc1"  # the keys of deploy/ascend-targets.yaml's `targets`

# The tests that show the request guard's media-option and uuid checks: on the CPU stack's server
# (0.32) and on each target's own app (plugin/tests, run in every target venv).
TARGETS_GUARD_TEST = ("plugin/tests/server/test_target_request_guard.py"
                      "::test_lone_surrogates_are_refused_by_the_guard_on_the_targets_app")
MM_KWARGS_TESTS = (
    "tests/test_client_isolation.py::test_per_request_media_options_are_a_400_unless_trusted",
    TARGETS_GUARD_TEST,
)
UUID_TESTS = (
    "tests/test_client_isolation.py::test_a_uuid_another_client_sent_reaches_nothing_without_a_key",
    TARGETS_GUARD_TEST,
)
# What "reachable" means for a route the kit serves: every route but /health, /ping and /metrics
# needs the API key when one is set (src/minicpmv_ascend/server/access.py); without a key (the
# default) every client reaches it. A key holder reaches every route either way.
NO_PROMPT_EMBEDS = ("prompt embeds are off unless vLLM gets --enable-prompt-embeds; the kit never passes it "
                    "(not a kit setting; a pass-through flag is forwarded, not refused)")


@dataclasses.dataclass(frozen=True)
class Verdict:
    status: Status
    kind: Kind | None = None  # None when not affected
    why: str = ""  # one line: the mitigation, the reason it is not reachable, or what would fix it
    setting: str | None = None  # a kit setting (minicpmv_ascend.settings.SETTINGS_BY_NAME)
    plugin: str | None = None  # a plugin patch's name (minicpmv_ascend_plugin.PATCHES)
    tests: tuple[str, ...] = ()  # "path::function", relative to the repository
    short: str = ""  # a few words for docs/reliability.md's cell; `why` stays the full reason


NOT_AFFECTED = Verdict("not affected")


def guard(why: str, setting: str | None, tests: tuple[str, ...], short: str = "refused (400)") -> Verdict:
    return Verdict("affected", "guard", why, setting=setting, tests=tests, short=short)


# /inference/v1/generate is one of the access control's admin routes (src/minicpmv_ascend/server/access.py):
# 403 unless enable_admin_routes. vLLM serves it on a plain start on 0.23 (serve/disagg/api_router.py,
# attached whenever the model generates); on 0.30 only with --enable-scale-out, which the kit never passes
# (vllm/entrypoints/scale_out/factories.py at 0.30.0).
GENERATE_ROUTE_TESTS = (
    "tests/test_access.py::test_every_route_of_vllms_app_needs_the_key_and_admin_routes_are_off",
    "plugin/tests/server/test_target_access.py::test_every_route_of_the_targets_app_needs_the_key_and_admin_routes_are_off",
)
GENERATE_ROUTE_OFF = Verdict("affected", "setting", "/inference/v1/generate answers 403 unless "
                             "`enable_admin_routes` (vLLM 0.23 serves it on a plain start)",
                             setting="enable_admin_routes", tests=GENERATE_ROUTE_TESTS,
                             short="/inference/v1/generate is 403")


REQUEST_TEMPLATE_REFUSED = guard(
    "a request's `chat_template` (top level or in `chat_template_kwargs`) is refused (400) on every route, "
    "the Responses API included, unless vLLM is started with --trust-request-chat-template (vLLM's flag)",
    None, ("tests/test_client_isolation.py::test_a_request_chat_template_is_a_400_unless_the_server_trusts_them",
           TARGETS_GUARD_TEST),
    short="a request `chat_template` is 400 unless vLLM's --trust-request-chat-template")


def unreachable(why: str, short: str) -> Verdict:
    return Verdict("affected", "not reachable", why, short=short)


def patched(why: str, plugin: str, tests: tuple[str, ...]) -> Verdict:
    return Verdict("affected", "plugin", why, plugin=plugin, tests=tests, short="fixed")


def open_(why: str, short: str = "fix: a newer target") -> Verdict:
    return Verdict("affected", "open", why, short=short)


@dataclasses.dataclass(frozen=True)
class Advisory:
    ids: tuple[str, ...]  # GHSA-..., CVE-..., PYSEC-... (the first is the one shown first)
    title: str
    affected: str  # the affected vLLM range as published: ">= 0.12.0, < 0.24.0"
    fixed: str | None  # the first fixed release, None where the sources state none
    link: str  # the advisory
    sources: tuple[str, ...]  # where the range and the description were read
    verdicts: Mapping[str, Verdict]  # target tag -> verdict
    verified: bool = True  # False: the advisory's own text was not readable; facts from the reports cited
    note: str = ""
    what: str = ""  # a few words for docs/reliability.md's table; `title` is the advisory's own summary


def _all(verdict: Verdict, affected: Sequence[str] = (T23,)) -> dict[str, Verdict]:
    """The same verdict for the affected targets, NOT_AFFECTED for the others."""
    return {tag: verdict if tag in affected else NOT_AFFECTED for tag in (T23, T30, T32)}


ADVISORIES: tuple[Advisory, ...] = (
    # --- fixed in 0.31.0 or 0.32.0: the default target (0.30) is in range -----------------------
    Advisory(
        ("GHSA-h3rc-6mm3-gc2m", "CVE-2026-114053"),
        "a request's `mm_processor_kwargs.code_revision` picks the processor code revision imported "
        "with `--trust-remote-code` (code execution)",
        ">= 0.7.3, < 0.31.0", "0.31.0",
        "https://github.com/vllm-project/vllm/security/advisories/GHSA-h3rc-6mm3-gc2m",
        ("https://raw.githubusercontent.com/CVEProject/cvelistV5/main/cves/2026/114xxx/CVE-2026-114053.json",),
        _all(guard("per-request `mm_processor_kwargs` are refused (400); besides, the kit never passes "
                   "--trust-remote-code (not a kit setting; a pass-through flag is forwarded, not refused)",
                   "trust_request_mm_kwargs", MM_KWARGS_TESTS), (T23, T30)),
        note="CVE record read; the GHSA id pairs with it by the same title and range",
        what="code execution through a request's `mm_processor_kwargs.code_revision`"),
    Advisory(
        ("GHSA-4xqp-c3mv-qff7", "CVE-2026-114051"),
        "`min_tokens` with a null `max_tokens` on /inference/v1/generate kills the engine's input thread "
        "while /health stays 200",
        "< 0.31.0", "0.31.0",
        "https://github.com/vllm-project/vllm/security/advisories/GHSA-4xqp-c3mv-qff7",
        ("https://osv.dev/vulnerability/CVE-2026-114051",
         "https://raw.githubusercontent.com/CVEProject/cvelistV5/main/cves/2026/114xxx/CVE-2026-114051.json"),
        {T23: GENERATE_ROUTE_OFF,
         T30: unreachable("vLLM 0.30 serves /inference/v1/generate only with --enable-scale-out, which the kit "
                          "never passes; with it, the route still answers 403 unless `enable_admin_routes`",
                          "needs --enable-scale-out"),
         T32: NOT_AFFECTED},
        what='/inference/v1/generate stalls the engine (`min_tokens`)'),
    Advisory(
        ("GHSA-p92p-rxj5-7p2x",),
        "a client-chosen multimodal `uuid` kills the engine (default configuration)",
        "< 0.31.0", "0.31.0",
        "https://github.com/vllm-project/vllm/security/advisories/GHSA-p92p-rxj5-7p2x",
        ("https://github.com/vllm-project/vllm/issues/55547",),
        _all(guard("media uuids are private: a uuid beside data is dropped, one without data replaced by a "
                   "random one (`media_uuids: shared` restores vLLM's behaviour)",
                   "media_uuids", UUID_TESTS, short="uuids are private"), (T23, T30)),
        verified=False,
        note="the advisory's text was not readable here: 'fixed in 0.31.0' and the crash come from news "
             "digests citing it (2026-10-06/07); the mechanism (a uuid is the sole cache key, a colliding "
             "one crashes the engine) is vllm-project/vllm#55547",
        what='a client-chosen media `uuid` kills the engine'),
    Advisory(
        ("GHSA-gx7p-2j49-hfq4",),
        "per-request `mm_processor_kwargs` (image size, patch, crop or frame counts) exhaust memory",
        ">= 0.7.3, < 0.31.0", "0.31.0",
        "https://github.com/advisories/GHSA-gx7p-2j49-hfq4",
        ("https://osv.dev/vulnerability/GHSA-3cgq-c484-rx5j",),
        _all(guard("per-request `mm_processor_kwargs` and `media_io_kwargs` are refused (400)",
                   "trust_request_mm_kwargs", MM_KWARGS_TESTS), (T23, T30)),
        note="read in GHSA-3cgq-c484-rx5j, withdrawn as its duplicate, which quotes the description",
        what='per-request `mm_processor_kwargs` exhaust memory'),
    Advisory(
        ("GHSA-6cxc-2vcg-w5qc", "CVE-2026-114049"),
        "InputBatch.condense leaves a stale `allowed_token_ids` mask on a recycled batch row: one "
        "client constrains another's output",
        "< 0.31.0", "0.31.0",
        "https://github.com/vllm-project/vllm/security/advisories/GHSA-6cxc-2vcg-w5qc",
        ("https://raw.githubusercontent.com/CVEProject/cvelistV5/main/cves/2026/114xxx/CVE-2026-114049.json",),
        _all(patched("the plugin backports the fix to vLLM's `InputBatch` (0.23 and 0.30 copy a moved row's "
                     "mask down in `condense` without clearing the row it left, and swap rows through views "
                     "in `swap_states`); vllm-ascend's `NPUInputBatch` extends it and overrides only "
                     "`__init__`, so its model runner runs the patched methods",
                     "allowed-token-ids-rows",
                     ("plugin/tests/patches/api/test_target_allowed_token_ids_rows.py"
                      "::test_no_request_keeps_another_requests_allowed_token_ids",)), (T23, T30)),
        note="the flaw is vllm-project/vllm#43894; vLLM 0.32's `InputBatch` has the fix: `condense` clears "
             "the row it moves a request from, `swap_states` swaps the rows with a copying index",
        what="one request's `allowed_token_ids` constrain another's output"),
    Advisory(
        ("GHSA-823j-m4cj-hmjf", "CVE-2026-114052", "PYSEC-2026-4361"),
        "MOSS-Audio caches a processor per distinct request `mm_processor_kwargs` (/tokenize): memory "
        "exhaustion",
        ">= 0.25.0, < 0.31.0", "0.31.0",
        "https://github.com/vllm-project/vllm/security/advisories/GHSA-823j-m4cj-hmjf",
        ("https://osv.dev/vulnerability/CVE-2026-114052", "https://osv.dev/vulnerability/PYSEC-2026-4361"),
        _all(unreachable("MOSS-Audio only; the kit serves MiniCPM-V 4.6 and 4.7 (and refuses per-request "
                         "`mm_processor_kwargs`)", "MOSS-Audio only"), (T30,)),
        note="range from the CVE record; the PyPA entry starts it at 0.24.0: 0.23 is outside either way",
        what='MOSS-Audio processor cache exhausts memory'),
    Advisory(
        ("CVE-2026-116180",),
        "uninitialized LogprobsTensors with a KV connector: `prompt_logprobs` on a connector-cached "
        "prefix crashes the engine",
        ">= 0.8.5, < 0.31.0", "0.31.0",
        "https://raw.githubusercontent.com/CVEProject/cvelistV5/main/cves/2026/116xxx/CVE-2026-116180.json",
        (),
        _all(unreachable("needs a KV connector; the kit configures none (no KV-transfer setting; a "
                         "pass-through --kv-transfer-config would add one)", "needs a KV connector"), (T23, T30)),
        what='`prompt_logprobs` with a KV connector crash the engine'),
    Advisory(
        ("GHSA-542m-9234-8gvf", "CVE-2026-115911", "PYSEC-2026-4344"),
        "a request chat template (no server `--chat-template`) renders without time or size bound",
        ">= 0.19.0, < 0.32.0", "0.32.0",
        "https://github.com/advisories/GHSA-542m-9234-8gvf",
        ("https://osv.dev/vulnerability/PYSEC-2026-4344", "https://www.tenable.com/plugins/cloud-security/477789"),
        _all(REQUEST_TEMPLATE_REFUSED, (T23, T30)),
        what='a request chat template renders without bound'),
    Advisory(
        ("PYSEC-2026-4349",),
        "/v1/responses takes `chat_template_kwargs[chat_template]` past `trust_request_chat_template` "
        "(CPU or memory exhaustion)",
        ">= 0.16.0, < 0.32.0", "0.32.0",
        "https://osv.dev/vulnerability/PYSEC-2026-4349",
        (),
        _all(REQUEST_TEMPLATE_REFUSED, (T23, T30)),
        note="its GHSA and CVE ids are not shown in the entry read",
        what='/v1/responses takes a request chat template'),
    # --- fixed in 0.29.0 or 0.30.0: only 0.23 is in range ---------------------------------------
    Advisory(
        ("GHSA-85xf-c7hm-whqw", "CVE-2026-105757", "PYSEC-2026-4199"),
        "structured-output request errors escape to the engine's fatal path (three sites)",
        "< 0.30.0", "0.30.0",
        "https://github.com/advisories/GHSA-85xf-c7hm-whqw",
        ("https://osv.dev/vulnerability/GHSA-85xf-c7hm-whqw", "https://osv.dev/vulnerability/PYSEC-2026-4199"),
        _all(open_("structured outputs are served to every client and the kit checks none (the ngram_gpu "
                   "and Rust-frontend sites are not used by the kit; the per-request backend one is); "
                   "fix: a newer target")),
        what='structured-output errors kill the engine'),
    Advisory(
        ("GHSA-ph72-cqr5-qpp7", "CVE-2026-105754"),
        "/inference/v1/generate trusts caller-supplied multimodal features (engine crash, encoder-cache "
        "poisoning)",
        "< 0.30.0", "0.30.0",
        "https://github.com/vllm-project/vllm/security/advisories/GHSA-ph72-cqr5-qpp7",
        ("https://osv.dev/vulnerability/CVE-2026-105754", "https://www.tenable.com/cve/CVE-2026-105754"),
        _all(GENERATE_ROUTE_OFF),
        what='/inference/v1/generate trusts caller multimodal features'),
    Advisory(
        ("PYSEC-2026-4353",),
        "inconsistent multimodal metadata on /inference/v1/generate crashes the engine",
        ">= 0.20.0, < 0.30.0", "0.30.0",
        "https://osv.dev/vulnerability/PYSEC-2026-4353",
        (),
        _all(GENERATE_ROUTE_OFF),
        note="its GHSA and CVE ids are not shown in the entry read",
        what='bad multimodal metadata on /inference/v1/generate crashes the engine'),
    Advisory(
        ("GHSA-58v5-2m8f-94pr", "CVE-2026-105760"),
        "request `media_io_kwargs` select the GLMGA video backend with unbounded fps and max_frames",
        "< 0.30.0", "0.30.0",
        "https://github.com/advisories/GHSA-58v5-2m8f-94pr",
        ("https://www.tenable.com/plugins/container-security/472970",),
        _all(guard("per-request `media_io_kwargs` are refused (400)", "trust_request_mm_kwargs",
                   MM_KWARGS_TESTS)),
        what='request `media_io_kwargs`: unbounded video fps and frames'),
    Advisory(
        ("PYSEC-2026-4325",),
        "the Rust frontend records raw HTTP method tokens as metric labels (memory growth)",
        "< 0.30.0", "0.30.0",
        "https://osv.dev/vulnerability/PYSEC-2026-4325",
        (),
        _all(unreachable("Rust frontend only; the kit starts vLLM's Python API server "
                         "(`python -m minicpmv_ascend.vllm_cli serve`)", "Rust frontend only")),
        note="its GHSA and CVE ids are not shown in the entry read",
        what='Rust frontend metric labels grow memory'),
    Advisory(
        ("CVE-2026-93989", "PYSEC-2026-4000"),
        "out-of-range `bad_words` token ids corrupt the logits of concurrent requests",
        "<= 0.29.0", "0.30.0",
        "https://osv.dev/vulnerability/CVE-2026-93989",
        ("https://osv.dev/vulnerability/PYSEC-2026-4000", "https://www.tenable.com/cve/CVE-2026-93989"),
        _all(open_("`bad_words` passes the kit unchecked (the advisory names GPU logits; the NPU sampler "
                   "was not checked); fix: a newer target")),
        note="the CVE record says 'through 0.29.0', the PyPA entry 'fixed 0.30.0'",
        what="out-of-range `bad_words` ids corrupt other requests' logits"),
    Advisory(
        ("CVE-2026-93840",),
        "`allowed_token_ids` checked against the tokenizer's length, not the logits width: cross-request "
        "logits corruption",
        "< 0.29.0", "0.29.0",
        "https://raw.githubusercontent.com/CVEProject/cvelistV5/main/cves/2026/93xxx/CVE-2026-93840.json",
        (),
        _all(open_("`allowed_token_ids` passes the kit unchecked (whether MiniCPM-V's tokenizer is longer "
                   "than its output vocabulary was not checked); fix: a newer target")),
        what='`allowed_token_ids` past the logits width corrupt other requests'),
    Advisory(
        ("CVE-2026-94622",),
        "incomplete NIXL `kv_transfer_params` kill the decode engine (prefill/decode disaggregation)",
        "<= 0.29.0", None,
        "https://raw.githubusercontent.com/CVEProject/cvelistV5/main/cves/2026/94xxx/CVE-2026-94622.json",
        (),
        _all(unreachable("needs the NIXL connector; the kit configures no KV connector", "needs a NIXL connector")),
        what='NIXL `kv_transfer_params` kill the decode engine'),
    Advisory(
        ("CVE-2026-94626",),
        "unvalidated NIXL `tp_size` in `kv_transfer_params` allocates unbounded memory",
        "<= 0.29.0", None,
        "https://raw.githubusercontent.com/CVEProject/cvelistV5/main/cves/2026/94xxx/CVE-2026-94626.json",
        (),
        _all(unreachable("needs the NIXL connector; the kit configures no KV connector", "needs a NIXL connector")),
        what='NIXL `tp_size` allocates unbounded memory'),
    Advisory(
        ("GHSA-87x5-vmc3-756j", "CVE-2026-73559"),
        "/v1/completions expands an unbounded list of prompts, one engine request each",
        ">= 0.19.0, < 0.26.0", "0.26.0",
        "https://github.com/vllm-project/vllm/security/advisories/GHSA-87x5-vmc3-756j",
        ("https://www.tenable.com/cve/CVE-2026-73559",),
        _all(open_("only bounded by the 160 MiB body limit (`max_request_body_mb`), which still holds "
                   "millions of short prompts; fix: a newer target, or a guard limit on prompt lists")),
        what='an unbounded list of prompts on /v1/completions'),
    # --- fixed in 0.24.0 -----------------------------------------------------------------------
    Advisory(
        ("GHSA-33cg-gxv8-3p8g", "CVE-2026-55514", "PYSEC-2026-2303"),
        "pure prompt embeds on an M-RoPE model crash the engine (/v1/completions)",
        ">= 0.12.0, < 0.24.0", "0.24.0",
        "https://github.com/advisories/GHSA-33cg-gxv8-3p8g",
        ("https://osv.dev/vulnerability/PYSEC-2026-2303",),
        _all(unreachable(NO_PROMPT_EMBEDS, "needs --enable-prompt-embeds")),
        what='prompt embeds on an M-RoPE model crash the engine'),
    Advisory(
        ("GHSA-v82g-2437-67m2", "CVE-2026-55646", "PYSEC-2026-2305"),
        "speech-to-text uploads are read whole before the size limit is checked",
        ">= 0.22.0, < 0.24.0", "0.24.0",
        "https://github.com/advisories/GHSA-v82g-2437-67m2",
        ("https://osv.dev/vulnerability/PYSEC-2026-2305",),
        _all(unreachable("MiniCPM-V 4.6 and 4.7 have no transcription task, and vLLM serves /v1/audio/* "
                         "only for one (vllm/entrypoints/launchers/api_server/routers.py, read at 0.32.0); "
                         "any body is capped at 160 MiB besides", "no transcription route")),
        what='speech-to-text uploads read whole before the size check'),
    Advisory(
        ("GHSA-6pr9-rp53-2pmc", "CVE-2026-54233"),
        "/v1/audio/transcriptions bounds the upload, not the decoded audio (decompression bomb)",
        "< 0.24.0", "0.24.0",
        "https://github.com/advisories/GHSA-6pr9-rp53-2pmc",
        (),
        _all(unreachable("no transcription route for MiniCPM-V (as GHSA-v82g-2437-67m2)", "no transcription route")),
        what='audio decompression bomb on /v1/audio/transcriptions'),
    Advisory(
        ("GHSA-5jv2-g5wq-cmr4", "CVE-2026-53923"),
        "integer truncation in the GGUF dequantize CUDA kernels exposes uninitialized GPU memory",
        ">= 0.5.5, < 0.24.0", "0.24.0",
        "https://github.com/advisories/GHSA-5jv2-g5wq-cmr4",
        (),
        _all(unreachable("a CUDA kernel for GGUF weights; the Ascend image runs no CUDA and the kit serves "
                         "safetensors checkpoints", "CUDA GGUF kernels only")),
        what='GGUF CUDA kernels expose uninitialized GPU memory'),
    Advisory(
        ("GHSA-hgg8-fqqc-vfmw", "CVE-2026-54236"),
        "the Anthropic router (/v1/messages) leaks PIL object reprs (memory addresses) in errors",
        "< 0.24.0", "0.24.0",
        "https://github.com/advisories/GHSA-hgg8-fqqc-vfmw",
        (),
        _all(open_("/v1/messages is served and the kit does not rewrite its errors; fix: a newer "
                   "target")),
        what='/v1/messages errors leak memory addresses'),
    Advisory(
        ("GHSA-rwxx-mrjm-wc2m", "CVE-2026-55574"),
        "`structured_outputs.regex` is compiled with no timeout (ReDoS in the grammar backends)",
        "< 0.24.0", "0.24.0",
        "https://github.com/advisories/GHSA-rwxx-mrjm-wc2m",
        (),
        _all(open_("structured outputs pass the kit unchecked; fix: a newer target")),
        what='ReDoS in `structured_outputs.regex`'),
    Advisory(
        ("GHSA-8jr5-v98p-w75m", "CVE-2026-12491"),
        "EXIF orientation and PNG transparency are not normalized: the model sees another image than "
        "a person does",
        ">= 0.11.0, < 0.24.0", "0.24.0",
        "https://github.com/advisories/GHSA-8jr5-v98p-w75m",
        (),
        _all(open_("images reach vLLM's loader as sent; fix: a newer target")),
        what='EXIF orientation and PNG transparency not normalized'),
    Advisory(
        ("GHSA-7h4p-rffg-7823", "CVE-2026-54235"),
        "NaN and infinite `temperature` pass every check and reach the sampling kernels",
        ">= 0.8.5, < 0.24.0", "0.24.0",
        "https://github.com/advisories/GHSA-7h4p-rffg-7823",
        (),
        _all(open_("`temperature` passes the kit unchecked (Python's JSON parser reads NaN and Infinity); "
                   "fix: a newer target")),
        what='NaN or infinite `temperature` reach the sampler'),
    Advisory(
        ("PYSEC-2026-4350",),
        "the Rust gRPC frontend lets more than 128 logprob token ids through and crashes the engine",
        ">= 0.22.0, < 0.24.0", "0.24.0",
        "https://osv.dev/vulnerability/PYSEC-2026-4350",
        (),
        _all(unreachable("gRPC frontend only; the kit serves vLLM's HTTP API server", "gRPC frontend only")),
        note="its GHSA and CVE ids are not shown in the entry read",
        what='Rust gRPC frontend: too many logprob ids crash the engine'),
    # --- no fixed release ----------------------------------------------------------------------
    Advisory(
        ("GHSA-98f3-hwg4-4rf7", "CVE-2026-9540"),
        "denial of service in 'some unknown processing' of the OpenAI-compatible serving path "
        "(reported on 0.19.0, via VulDB)",
        ">= 0", None,
        "https://github.com/advisories/GHSA-98f3-hwg4-4rf7",
        ("https://github.com/vllm-project/vllm/issues/37343", "https://github.com/vllm-project/vllm/pull/37594"),
        _all(open_("reachable: `n` > 1 and `top_logprobs` are on (n up to `max_num_seqs`, top_logprobs up "
                   "to vLLM's --max-logprobs), and while one request asks for logprobs vLLM's sampler "
                   "computes a full-vocabulary log-softmax for every row of every step, so its n sequences "
                   "slow every co-scheduled request's steps (a slowdown while it runs, no crash or hang); no "
                   "target's scheduler budgets logprobs (the proposed fix, vllm-project/vllm#37594, is "
                   "unmerged); an operator can pass vLLM's --max-logprobs lower",
                   "pass vLLM's --max-logprobs lower"), (T23, T30, T32)),
        note="the mechanism is vllm-project/vllm#37343 (n=8 with top_logprobs=20 beside plain requests: "
             "their time to first token 76-423x); the advisory's own text names none",
        what='denial of service in the OpenAI-compatible path (VulDB)'),
    Advisory(
        ("GHSA-x9pq-jx6q-p3qv",),
        "prompt embeds with sampling penalties crash the engine (low severity, unreviewed, from VulDB)",
        "<= 0.31.0", None,
        "https://github.com/advisories/GHSA-x9pq-jx6q-p3qv",
        (),
        _all(unreachable(NO_PROMPT_EMBEDS, "needs --enable-prompt-embeds"), (T23, T30)),
        verified=False,
        note="the advisory's text was not readable here: the range ('through 0.31.0') and the "
             "description come from a news digest citing it (2026-10-06)",
        what='prompt embeds with penalties crash the engine (VulDB)'),
    # --- named by operators' scanners, outside every target's range -----------------------------
    Advisory(
        ("GHSA-wcwg-c5fc-9vrc", "CVE-2026-5497"),
        "a `video/jpeg` data URL with unbounded comma-separated frames exhausts memory",
        ">= 0.8.0, < 0.19.0", "0.19.0",
        "https://github.com/advisories/GHSA-wcwg-c5fc-9vrc",
        ("https://nvd.nist.gov/vuln/detail/CVE-2026-5497",
         "https://github.com/vllm-project/vllm/commit/58ee61422169ce17e08248f8efa1e9df434fe395"),
        _all(NOT_AFFECTED, ()),
        note="same flaw as GHSA-pq5c-rjhq-qp7p (CVE-2026-34755, >= 0.7.0, < 0.19.0)",
        what='unbounded `video/jpeg` data URL frames exhaust memory'),
)

# Named in the sources read, but with no record that gives a vLLM range: listed so that nobody
# takes their absence from the table for a verdict.
UNASSESSED: tuple[tuple[str, str, str], ...] = (
    ("CVE-2026-105775",
     "https://raw.githubusercontent.com/CVEProject/cvelistV5/main/cves/2026/105xxx/CVE-2026-105775.json",
     "VulDB: an out-of-bounds read in mamba_mixer2.py's conv_ssm_forward from a completions request; the "
     "record lists versions by minor release and was not read to its end (MiniCPM-V 4.6 and 4.7 are "
     "not Mamba models)"),
    ("CVE-2026-93592", "",
     "named in a third-party article as one unauthenticated request that stops the engine, fixed in "
     "0.28.0; no advisory, CVE record or PyPA entry was found"),
)

BY_ID = {advisory.ids[0]: advisory for advisory in ADVISORIES}


def cell(verdict: Verdict) -> str:
    """A few words: how the kit stands, naming the setting or plugin patch; `why` is the full reason."""
    if verdict.status == "not affected":
        return "not affected"
    label = f"**{verdict.kind}**" if verdict.kind == "open" else str(verdict.kind)
    named = f" `{verdict.setting}`" if verdict.setting else f" `{verdict.plugin}`" if verdict.plugin else ""
    return f"{label}{named}: {verdict.short}"


def kit_cell(advisory: Advisory, tags: Sequence[str]) -> tuple[str, str]:
    """(the targets in the published range, how the kit stands on them): one verdict where they
    share it, else one per target."""
    hit = [tag for tag in tags if advisory.verdicts[tag].status == "affected"]
    cells = dict.fromkeys(cell(advisory.verdicts[tag]) for tag in hit)
    if len(cells) <= 1:
        return ", ".join(hit) or "none", next(iter(cells), "-")
    return ", ".join(hit), "; ".join(f"{tag}: {cell(advisory.verdicts[tag])}" for tag in hit)


def _ids(advisory: Advisory) -> str:
    first, *rest = advisory.ids
    return f"[{first}]({advisory.link})" + "".join(f"<br>{other}" for other in rest)


def _vllm_versions() -> dict[str, str]:
    from minicpmv_ascend.tools import targets  # YAML, imported only to draw the table

    return {tag: str(target["vllm"]) for tag, target in targets.load(None)["targets"].items()}


def markdown(versions: Mapping[str, str] | None = None) -> str:
    """docs/reliability.md's table (scripts/doc_tables.py `advisories`): what an operator needs per
    advisory; the reasons, sources and tests stay in the records above."""
    versions = dict(versions) if versions is not None else _vllm_versions()
    tags = [tag for tag in (T23, T30, T32) if tag in versions]
    rows = ["Targets: " + ", ".join(f"{tag} (vLLM {versions[tag]})" for tag in tags) + ".", "",
            "| advisory | what | fixed in | targets in range | the kit on them |", "|---|---|---|---|---|"]
    for a in ADVISORIES:
        what = a.what + ("" if a.verified else " *(unverified)*")
        rows.append("| " + " | ".join([_ids(a), what, a.fixed or "none stated", *kit_cell(a, tags)]) + " |")
    unassessed = ", ".join(ident for ident, _url, _why in UNASSESSED)
    rows += ["", f"Named but not assessed (no published vLLM range): {unassessed}."]
    return "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the targets' vLLM security advisories")
    parser.add_argument("--markdown", action="store_true", help="print docs/reliability.md's table")
    if parser.parse_args(argv).markdown:
        sys.stdout.write(markdown())
    else:
        for a in ADVISORIES:
            verdicts = ", ".join(f"{tag}: {v.kind or v.status}" for tag, v in a.verdicts.items())
            print(f"{a.ids[0]:<22} {a.affected:<22} {verdicts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
