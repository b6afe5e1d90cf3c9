"""Accuracy parity: does an endpoint answer like the reference, within the noise of a healthy run?

    minicpmv-parity --reference hf:/models/MiniCPM-V-4.6-Thinking \\
        --floor http://gpu-host:8000 --candidate http://npu-host:8000

For every prompt of a versioned prompt set (text, reasoning, images of several sizes, 4x/16x,
multi-image), the reference greedily continues the chat. That continuation is then teacher-forced
through every run (one chat request with the continuation as a final assistant message,
`continue_final_message`, `prompt_logprobs`), after checking that every run saw exactly the same
token ids (`return_token_ids`). Position by position the next-token distributions are compared:
top-1 agreement, "confident flips" (the reference was sure, the run chose otherwise), top-5
overlap, |delta logprob| of the forced token. A short free-running greedy comparison follows: at
the first divergence, each side's token must be in the other's top-5. `--floor` is a second healthy
run (e.g. HF fp32 vs vLLM bf16): the |delta logprob| bars are set relative to it (the thresholds and
why: docs/design/accuracy.md).

Reference: `hf:DIR` (transformers, fp32, on the CPU, the checkpoint's own chat template and
processor) or an OpenAI-compatible vLLM base URL. Runs: vLLM base URLs (`prompt_logprobs` and
`return_token_ids` are vLLM extensions, present since long before 0.23).

Exit status: 0 every candidate passes, 1 a candidate fails, 2 usage error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import sys
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

from minicpmv_ascend.common.api_key import ApiKeyError, api_key_from_env
from minicpmv_ascend.common.http import Client, RequestFailed
from minicpmv_ascend.probes import png_data_url
from minicpmv_ascend.tools import parity_prompts
from minicpmv_ascend.tools.parity_prompts import Prompt, PromptError

REPORT_VERSION = "1"
TOP_K = 5
# The chat template's generation prompt opens the think block; the teacher-forced continuation is
# sent as the final assistant message starting with it, so that its rendering continues the
# generation prompt exactly (checked for every prompt: the ids must start with the prompt's ids).
THINK_OPEN = "<think>\n"
# A continuation ends before the first of these: the template would rewrite a think block
# (`</think>`), and layout or image tokens would be re-read as image placeholders.
MARKER_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
    "<image>", "</image>", "<slice>", "</slice>", "<image_id>", "</image_id>", "<unk>",
)


@dataclasses.dataclass(frozen=True)
class Threshold:
    default: float
    help: str


# docs/design/accuracy.md, "Thresholds"; every value can be overridden with --threshold NAME=VALUE.
THRESHOLDS = {
    "prompt_id_mismatches_max": Threshold(0, "prompts whose token ids differ from the reference's"),
    "errors_max": Threshold(0, "prompts whose requests failed"),
    "top1_min": Threshold(0.985, "top-1 agreement, fraction of positions"),
    "top1_below_floor_max": Threshold(0.005, "how far top-1 agreement may fall below the floor's (0.005 = 0.5 pp)"),
    "confident_gap": Threshold(0.5, "reference top-1/top-2 log-prob gap (nat) that makes a position confident"),
    "confident_flips_max": Threshold(0, "top-1 disagreements at confident positions"),
    "top5_overlap_min": Threshold(0.9, "mean shared fraction of the top-5 tokens"),
    "median_vs_floor_max": Threshold(1.5, "median |delta logprob| as a multiple of the floor's"),
    "p99_vs_floor_max": Threshold(2.0, "p99 |delta logprob| as a multiple of the floor's"),
    "floor_abs_min": Threshold(0.01, "floor values (nat) are raised to at least this: bf16's resolution"),
    "free_run_hard_max": Threshold(0, "free runs whose first divergence is outside the other side's top-5"),
}


class ParityUsageError(Exception):
    """Bad arguments, references or prompt files (exit 2); the message says how to fix it."""


# ---------------------------------------------------------------------------------------------
# What a run returns


@dataclasses.dataclass
class Dist:
    """One next-token distribution: the top-k (id, logprob) best first, and the logprob of the
    token that actually came next (teacher forcing) when there is one."""

    top: list[tuple[int, float]]
    actual: float | None = None


@dataclasses.dataclass
class Greedy:
    prompt_ids: list[int]
    token_ids: list[int]
    dists: list[Dist]


@dataclasses.dataclass
class Forced:
    ids: list[int]
    dists: dict[int, Dist]  # position -> distribution over the token at that position


def _top(pairs: Any) -> list[tuple[int, float]]:
    return sorted(((int(i), float(lp)) for i, lp in pairs), key=lambda p: -p[1])[:TOP_K]


class HFReference:
    """transformers in fp32 on the CPU, loading the checkpoint directory itself."""

    def __init__(self, path: pathlib.Path):
        import torch
        import transformers
        from transformers import AutoModelForImageTextToText, AutoProcessor

        transformers.logging.set_verbosity_error()
        self.torch = torch
        self.label = f"hf:{path} (transformers {transformers.__version__}, fp32, CPU)"
        self.processor = AutoProcessor.from_pretrained(path)
        # The class config.json names (MiniCPMV4_6... or MiniCPMV4_7ForConditionalGeneration).
        self.model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
        tokenizer = self.processor.tokenizer
        vocab = tokenizer.get_vocab()
        self.marker_ids = {vocab[t] for t in MARKER_TOKENS if t in vocab} | set(tokenizer.all_special_ids)

    def _inputs(self, prompt: Prompt, continuation: str | None):
        parts = [{"type": "image"} for _ in prompt.images] + [{"type": "text", "text": prompt.text}]
        messages = [{"role": "user", "content": parts}]
        if continuation is not None:
            messages.append({"role": "assistant", "content": THINK_OPEN + continuation})
        text = self.processor.apply_chat_template(
            messages, tokenize=False,
            add_generation_prompt=continuation is None, continue_final_message=continuation is not None,
        )
        images = [[spec.load() for spec in prompt.images]] if prompt.images else None
        return self.processor(text=[text], images=images, return_tensors="pt", **prompt.mm_processor_kwargs)

    def _model_kwargs(self, prompt: Prompt) -> dict[str, Any]:
        mode = prompt.mm_processor_kwargs.get("downsample_mode")
        return {"downsample_mode": mode} if mode else {}

    def greedy(self, prompt: Prompt, max_tokens: int) -> Greedy:
        inputs = self._inputs(prompt, None)
        with self.torch.no_grad():
            out = self.model.generate(
                **inputs, **self._model_kwargs(prompt), max_new_tokens=max_tokens, do_sample=False,
                temperature=None, top_p=None, top_k=None, output_logits=True, return_dict_in_generate=True,
            )
        prompt_ids = inputs["input_ids"][0].tolist()
        dists = []
        for logits in out.logits:
            values, ids = logits[0].float().log_softmax(-1).topk(TOP_K)
            dists.append(Dist(_top(zip(ids.tolist(), values.tolist()))))
        return Greedy(prompt_ids, out.sequences[0, len(prompt_ids):].tolist(), dists)

    def teacher_force(self, prompt: Prompt, continuation: str, start: int) -> Forced:
        inputs = self._inputs(prompt, continuation)
        with self.torch.no_grad():
            logprobs = self.model(**inputs, **self._model_kwargs(prompt)).logits[0].float().log_softmax(-1)
        ids = inputs["input_ids"][0].tolist()
        dists = {}
        for pos in range(start, len(ids)):  # logits at pos - 1 predict the token at pos
            values, top_ids = logprobs[pos - 1].topk(TOP_K)
            dists[pos] = Dist(_top(zip(top_ids.tolist(), values.tolist())), float(logprobs[pos - 1, ids[pos]]))
        return Forced(ids, dists)

    def detokenize(self, ids: list[int]) -> str:
        return self.processor.tokenizer.decode(ids)


def refuses_processor_options(exc: RequestFailed) -> bool:
    """vLLM >= 0.32 refuses per-request mm_processor_kwargs unless started with --trust-request-mm-kwargs."""
    return "--trust-request-mm-kwargs" in str(exc)


def processor_options_refused(label: str, prompt: Prompt) -> ParityUsageError:
    return ParityUsageError(
        f"{label} refuses the per-request mm_processor_kwargs of prompt {prompt.id} "
        f"({json.dumps(prompt.mm_processor_kwargs)}): start that server with --trust-request-mm-kwargs, "
        "or leave such prompts out with --prompt / --subset")


class Endpoint:
    """A vLLM OpenAI-compatible server."""

    def __init__(self, base_url: str, model: str | None, timeout: float, api_key: str | None, role: str):
        self.client = Client(base_url.rstrip("/"), timeout, api_key)
        self.label = base_url
        try:
            status, body = self.client.get("/v1/models")
            served = [m["id"] for m in json.loads(body)["data"]]
        except (RequestFailed, ValueError, KeyError, TypeError) as exc:
            raise ParityUsageError(
                f"{role} {base_url}: GET /v1/models failed ({exc}); check the URL (scheme, host, port, no /v1 "
                "suffix) and that the server is up and ready"
            ) from exc
        if model and model not in served:
            raise ParityUsageError(f"{role} {base_url} does not serve model {model!r} (it serves {served}); fix --model")
        if not model and not served:
            raise ParityUsageError(f"{role} {base_url} lists no model under /v1/models")
        self.model = model or served[0]
        self._marker_ids: set[int] | None = None

    def _chat(self, prompt: Prompt, extra_messages: list[dict], **body: Any) -> dict[str, Any]:
        parts = [{"type": "image_url", "image_url": {"url": png_data_url(_png(spec))}} for spec in prompt.images]
        parts.append({"type": "text", "text": prompt.text})
        payload = {
            "model": self.model,
            "messages": [{"role": "user", "content": parts}, *extra_messages],
            "temperature": 0,
            "return_token_ids": True,
            **body,
        }
        if prompt.mm_processor_kwargs:
            payload["mm_processor_kwargs"] = prompt.mm_processor_kwargs
        return self.client.post_json("/v1/chat/completions", payload)

    def check_processor_options(self, prompt: Prompt) -> None:
        """Ask once, with a one-token text request carrying `prompt`'s mm_processor_kwargs, whether
        this server accepts per-request processor options: before the reference runs (minutes on
        a real model), not at the first prompt that has them."""
        try:
            self.client.post_json("/v1/chat/completions", {
                "model": self.model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
                "mm_processor_kwargs": prompt.mm_processor_kwargs})
        except RequestFailed as exc:
            if refuses_processor_options(exc):
                raise processor_options_refused(self.label, prompt) from exc
            # anything else is the prompt loop's to report, on the prompt itself

    def greedy(self, prompt: Prompt, max_tokens: int) -> Greedy:
        response = self._chat(
            prompt, [], max_tokens=max_tokens, logprobs=True, top_logprobs=TOP_K,
            return_tokens_as_token_ids=True, skip_special_tokens=False,
        )
        choice = response["choices"][0]
        dists = [
            Dist(_top((t["token"].removeprefix("token_id:"), t["logprob"]) for t in item["top_logprobs"]))
            for item in (choice.get("logprobs") or {}).get("content") or []
        ]
        return Greedy(response["prompt_token_ids"], choice["token_ids"], dists)

    def teacher_force(self, prompt: Prompt, continuation: str, start: int) -> Forced:
        response = self._chat(
            prompt, [{"role": "assistant", "content": THINK_OPEN + continuation}],
            max_tokens=1, prompt_logprobs=TOP_K, continue_final_message=True, add_generation_prompt=False,
        )
        ids = response["prompt_token_ids"]
        prompt_logprobs = response.get("prompt_logprobs")
        if not prompt_logprobs:
            raise RequestFailed(self.label, "no prompt_logprobs in the response (not a vLLM server?)")
        dists = {}
        for pos in range(start, len(ids)):
            entries = prompt_logprobs[pos]
            top = _top((i, e["logprob"]) for i, e in entries.items() if e.get("rank", TOP_K + 1) <= TOP_K)
            dists[pos] = Dist(top, entries[str(ids[pos])]["logprob"])
        return Forced(ids, dists)

    def detokenize(self, ids: list[int]) -> str:
        return self.client.post_json("/detokenize", {"model": self.model, "tokens": ids})["prompt"]

    @property
    def marker_ids(self) -> set[int]:
        if self._marker_ids is None:  # the single-token markers of this server's tokenizer
            self._marker_ids = set()
            for marker in MARKER_TOKENS:
                ids = self.client.post_json(
                    "/tokenize", {"model": self.model, "prompt": marker, "add_special_tokens": False}
                )["tokens"]
                if len(ids) == 1:
                    self._marker_ids.add(ids[0])
        return self._marker_ids


_PNG_CACHE: dict[parity_prompts.ImageSpec, bytes] = {}


def _png(spec: parity_prompts.ImageSpec) -> bytes:
    if spec not in _PNG_CACHE:
        import io

        buffer = io.BytesIO()
        spec.load().save(buffer, "PNG")
        _PNG_CACHE[spec] = buffer.getvalue()
    return _PNG_CACHE[spec]


# ---------------------------------------------------------------------------------------------
# Reference data, and one run compared against it


@dataclasses.dataclass
class ReferenceCase:
    prompt: Prompt
    greedy: Greedy
    continuation: str  # the text teacher-forced through every run
    forced: Forced | None  # None: the continuation is empty (the reference ended its thought at once)


def reference_case(ref, prompt: Prompt, max_tokens: int) -> ReferenceCase:
    greedy = ref.greedy(prompt, max_tokens)
    cut = next((i for i, t in enumerate(greedy.token_ids) if t in ref.marker_ids), len(greedy.token_ids))
    continuation = ref.detokenize(greedy.token_ids[:cut]) if cut else ""
    if not continuation.strip():
        return ReferenceCase(prompt, greedy, "", None)
    forced = ref.teacher_force(prompt, continuation, len(greedy.prompt_ids))
    if forced.ids[: len(greedy.prompt_ids)] != greedy.prompt_ids:
        raise ParityUsageError(
            f"prompt {prompt.id}: the chat template does not render an assistant message starting with "
            f"{THINK_OPEN!r} as a continuation of its generation prompt, so nothing can be teacher-forced; "
            "use the checkpoint's own (thinking) chat template"
        )
    return ReferenceCase(prompt, greedy, continuation, forced)


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _best(dist: Dist) -> set[int]:
    """The top-1 token, or every token tied with it (bf16 logprobs tie often)."""
    best = dist.top[0][1]
    return {i for i, lp in dist.top if lp >= best - 1e-6}


def compare_case(case: ReferenceCase, run, free_tokens: int, confident_gap: float) -> dict[str, Any]:
    """One prompt through one run, compared with the reference: a JSON-ready dict."""
    result: dict[str, Any] = {"prompt": case.prompt.id, "subset": case.prompt.subset, "error": None,
                              "id_mismatch": None, "positions": [], "free_run": None}
    try:
        greedy = run.greedy(case.prompt, free_tokens)
        if greedy.prompt_ids != case.greedy.prompt_ids:
            result["id_mismatch"] = _mismatch("prompt", case.greedy.prompt_ids, greedy.prompt_ids)
            return result
        result["free_run"] = _free_run(case.greedy, greedy, free_tokens)
        if case.forced is None:
            return result
        forced = run.teacher_force(case.prompt, case.continuation, len(case.greedy.prompt_ids))
    except RequestFailed as exc:
        if refuses_processor_options(exc):
            raise processor_options_refused(run.label, case.prompt) from exc
        result["error"] = str(exc)
        return result
    if forced.ids != case.forced.ids:
        result["id_mismatch"] = _mismatch("teacher-forced", case.forced.ids, forced.ids)
        return result
    for pos, ref in case.forced.dists.items():
        got = forced.dists[pos]
        gap = ref.top[0][1] - ref.top[1][1] if len(ref.top) > 1 else math.inf
        agree = bool(_best(ref) & _best(got))
        result["positions"].append({
            "top1_agree": agree,
            "confident_flip": not agree and gap >= confident_gap,
            "top5_overlap": len({i for i, _ in ref.top} & {i for i, _ in got.top}) / TOP_K,
            "abs_dlogprob": abs(ref.actual - got.actual),
            "ref_gap": min(gap, 1e9),
        })
    return result


def _mismatch(stage: str, ref: list[int], got: list[int]) -> dict[str, Any]:
    index = _first_difference(ref, got)
    return {"stage": stage, "index": index, "ref_len": len(ref), "run_len": len(got),
            "ref_ids": ref[index:index + 8], "run_ids": got[index:index + 8]}


def _free_run(ref: Greedy, run: Greedy, n: int) -> dict[str, Any]:
    a, b = ref.token_ids[:n], run.token_ids[:n]
    if a == b:
        return {"identical": True, "diverged_at": None, "hard": False}
    at = _first_difference(a, b)
    if at >= min(len(a), len(b)) or at >= min(len(ref.dists), len(run.dists)):
        return {"identical": False, "diverged_at": at, "hard": True, "why": "one side stopped earlier"}
    run_in_ref = b[at] in {i for i, _ in ref.dists[at].top}
    ref_in_run = a[at] in {i for i, _ in run.dists[at].top}
    return {"identical": False, "diverged_at": at, "hard": not (run_in_ref and ref_in_run),
            "ref_token": a[at], "run_token": b[at], "run_in_ref_top5": run_in_ref, "ref_in_run_top5": ref_in_run}


# ---------------------------------------------------------------------------------------------
# Metrics, checks


def metrics(results: list[dict[str, Any]]) -> dict[str, Any]:
    import numpy as np

    positions = [p for r in results for p in r["positions"]]
    deltas = np.array([p["abs_dlogprob"] for p in positions]) if positions else None
    free = [r["free_run"] for r in results if r["free_run"]]
    return {
        "prompts": len(results),
        "positions": len(positions),
        "errors": sum(r["error"] is not None for r in results),
        "prompt_id_mismatches": sum(r["id_mismatch"] is not None for r in results),
        "top1_agreement": sum(p["top1_agree"] for p in positions) / len(positions) if positions else None,
        "confident_flips": sum(p["confident_flip"] for p in positions),
        "top5_overlap": sum(p["top5_overlap"] for p in positions) / len(positions) if positions else None,
        "median_abs_dlogprob": float(np.median(deltas)) if positions else None,
        "p99_abs_dlogprob": float(np.percentile(deltas, 99)) if positions else None,
        "max_abs_dlogprob": float(deltas.max()) if positions else None,
        "free_runs": len(free),
        "free_run_identical": sum(f["identical"] for f in free),
        "free_run_hard": sum(f["hard"] for f in free),
    }


def checks(m: dict[str, Any], floor: dict[str, Any] | None, t: dict[str, float]) -> list[dict[str, Any]]:
    """Each bar (docs/design/accuracy.md): name, measured value, limit, passed (None: could not be evaluated)."""
    out = []

    def check(name: str, value: Any, limit: Any, passed: bool | None, note: str = "") -> None:
        out.append({"check": name, "value": value, "limit": limit, "passed": passed, "note": note})

    check("prompt ids identical", m["prompt_id_mismatches"], f"<= {t['prompt_id_mismatches_max']:g}",
          m["prompt_id_mismatches"] <= t["prompt_id_mismatches_max"])
    check("requests succeed", m["errors"], f"<= {t['errors_max']:g}", m["errors"] <= t["errors_max"])
    if not m["positions"]:
        check("compared positions", 0, "> 0", False, "nothing could be compared")
        return out
    top1 = m["top1_agreement"]
    check("top-1 agreement", top1, f">= {t['top1_min']:g}", top1 >= t["top1_min"])
    check("confident flips", m["confident_flips"], f"<= {t['confident_flips_max']:g}",
          m["confident_flips"] <= t["confident_flips_max"])
    check("top-5 overlap", m["top5_overlap"], f">= {t['top5_overlap_min']:g}", m["top5_overlap"] >= t["top5_overlap_min"])
    check("free-run divergence in top-5", m["free_run_hard"], f"<= {t['free_run_hard_max']:g}",
          m["free_run_hard"] <= t["free_run_hard_max"])
    if not floor or not floor["positions"]:
        note = "no floor (--floor) for this subset"
        for name in ("top-1 vs floor", "median |dlogprob| vs floor", "p99 |dlogprob| vs floor"):
            check(name, None, None, None, note)
        return out
    limit = floor["top1_agreement"] - t["top1_below_floor_max"]
    check("top-1 vs floor", top1, f">= {limit:.4f}", top1 >= limit)
    for key, name, factor in (("median_abs_dlogprob", "median |dlogprob| vs floor", t["median_vs_floor_max"]),
                              ("p99_abs_dlogprob", "p99 |dlogprob| vs floor", t["p99_vs_floor_max"])):
        limit = factor * max(floor[key], t["floor_abs_min"])
        check(name, m[key], f"<= {limit:.4g}", m[key] <= limit)
    return out


def evaluate(results: list[dict[str, Any]], floor_results: list[dict[str, Any]] | None,
             subsets: list[str], t: dict[str, float]) -> dict[str, Any]:
    per_subset = {}
    for subset in subsets:
        mine = [r for r in results if r["subset"] == subset]
        floor = metrics([r for r in floor_results if r["subset"] == subset]) if floor_results else None
        m = metrics(mine)
        c = checks(m, floor, t)
        per_subset[subset] = {"metrics": m, "checks": c, "passed": all(x["passed"] is not False for x in c)}
    return {"subsets": per_subset, "passed": all(s["passed"] for s in per_subset.values())}


def failing_prompts(results: list[dict[str, Any]], floor_by_prompt: dict[str, Any], t: dict[str, float]) -> list[str]:
    """Prompts that show a problem on their own: an error, different ids, a confident flip, a hard
    free-run divergence, or a |delta logprob| beyond its subset's p99 limit."""
    failing = []
    for r in results:
        p99_limit = None
        floor = floor_by_prompt.get(r["prompt"])
        if floor is not None and floor["positions"]:
            p99_limit = t["p99_vs_floor_max"] * max(floor["positions_p99"], t["floor_abs_min"])
        deltas = [p["abs_dlogprob"] for p in r["positions"]]
        if (r["error"] or r["id_mismatch"] or any(p["confident_flip"] for p in r["positions"])
                or (r["free_run"] or {}).get("hard")
                or (p99_limit is not None and deltas and max(deltas) > p99_limit)):
            failing.append(r["prompt"])
    return failing


# ---------------------------------------------------------------------------------------------
# Reports


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"
    return str(value)


TABLE_COLUMNS = ("run", "subset", "prompts", "positions", "id mism.", "errors", "top-1", "conf. flips",
                 "top-5", "median |d|", "p99 |d|", "free-run hard", "verdict")


def table_rows(report: dict[str, Any]) -> list[list[str]]:
    rows = []
    runs = ([("floor", report["floor"])] if report.get("floor") else []) + [
        (f"candidate {i + 1}", c) for i, c in enumerate(report["candidates"])]
    for name, run in runs:
        for subset, s in run["evaluation"]["subsets"].items():
            m = s["metrics"]
            verdict = "PASS" if s["passed"] else "FAIL: " + ", ".join(
                c["check"] for c in s["checks"] if c["passed"] is False)
            if name == "floor":
                verdict = "(noise floor)"
            rows.append([name, subset, str(m["prompts"]), str(m["positions"]), str(m["prompt_id_mismatches"]),
                         str(m["errors"]), _fmt(m["top1_agreement"]), str(m["confident_flips"]),
                         _fmt(m["top5_overlap"], 3), _fmt(m["median_abs_dlogprob"]), _fmt(m["p99_abs_dlogprob"]),
                         str(m["free_run_hard"]), verdict])
    return rows


def terminal_table(report: dict[str, Any]) -> str:
    rows = [list(TABLE_COLUMNS), *table_rows(report)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_COLUMNS) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def plot_case(path: pathlib.Path, title: str, run: dict[str, Any], floor: dict[str, Any] | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.2))
    deltas = [max(p["abs_dlogprob"], 1e-6) for p in run["positions"]]
    ax.plot(range(len(deltas)), deltas, marker=".", label="candidate vs reference")
    if floor and floor["positions"]:
        ax.plot([max(p["abs_dlogprob"], 1e-6) for p in floor["positions"]], color="grey", linestyle="--",
                label="floor vs reference")
    flips = [i for i, p in enumerate(run["positions"]) if not p["top1_agree"]]
    if flips:
        ax.scatter(flips, [deltas[i] for i in flips], color="red", marker="x", zorder=3, label="top-1 differs")
    ax.set_yscale("log")
    ax.set_xlabel("position in the teacher-forced continuation")
    ax.set_ylabel("|delta logprob| (nat)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a literal | would end the Markdown table cell


def markdown_report(report: dict[str, Any], out_dir: pathlib.Path) -> str:
    lines = [
        "# Accuracy parity report", "",
        f"- verdict: **{'PASS' if report['passed'] else 'FAIL'}**",
        f"- reference: `{report['reference']}`",
        f"- floor: `{report['floor']['label']}`" if report.get("floor") else "- floor: none (floor-relative checks skipped)",
        *[f"- candidate {i + 1}: `{c['label']}`" for i, c in enumerate(report["candidates"])],
        f"- prompt set: version {report['prompt_set_version']}, {len(report['prompts'])} prompts; "
        f"continuation {report['settings']['max_tokens']} tokens, free run {report['settings']['free_tokens']} tokens",
        f"- run time: {report['seconds']:.0f} s", "",
        "## Summary", "",
        *["| " + " | ".join(map(_cell, r)) + " |" for r in [list(TABLE_COLUMNS), ["---"] * len(TABLE_COLUMNS),
                                                           *table_rows(report)]], "",
        "## Thresholds", "", "| name | value | meaning |", "|---|---|---|",
        *[f"| `{k}` | {v:g} | {_cell(THRESHOLDS[k].help)} |" for k, v in report["thresholds"].items()], "",
    ]
    plots_dir = out_dir / "plots"
    for i, cand in enumerate(report["candidates"]):
        lines += [f"## Candidate {i + 1}: `{cand['label']}`", ""]
        for subset, s in cand["evaluation"]["subsets"].items():
            failed = [c for c in s["checks"] if c["passed"] is False]
            if failed:
                lines.append(f"- **{subset}** fails: " + "; ".join(
                    f"{c['check']} = {_fmt(c['value'])} (limit {c['limit']})" for c in failed))
        if not cand["failing_prompts"]:
            lines += ["", "No prompt fails on its own.", ""]
            continue
        lines += ["", "Failing prompts:", ""]
        floor_by_prompt = {r["prompt"]: r for r in (report.get("floor") or {}).get("results", [])}
        for r in (r for r in cand["results"] if r["prompt"] in cand["failing_prompts"]):
            lines.append(f"### `{r['prompt']}` ({r['subset']})")
            lines.append("")
            if r["error"]:
                lines.append(f"Request failed: `{r['error']}`")
            elif r["id_mismatch"]:
                mm = r["id_mismatch"]
                lines.append(
                    f"{mm['stage'].capitalize()} token ids differ from index {mm['index']} on (reference "
                    f"{mm['ref_len']} ids, candidate {mm['run_len']}); reference `{mm['ref_ids']}`, candidate "
                    f"`{mm['run_ids']}`. Different ids mean different preprocessing (chat template, image "
                    "slicing or placeholder count): nothing after that point is comparable.")
            else:
                flips = sum(p["confident_flip"] for p in r["positions"])
                lines.append(f"{len(r['positions'])} positions, {flips} confident flips, max |delta logprob| "
                             f"{_fmt(max((p['abs_dlogprob'] for p in r['positions']), default=None))}; "
                             f"free run: {json.dumps(r['free_run'])}")
                name = f"candidate{i + 1}-{r['prompt']}.png"
                try:
                    plots_dir.mkdir(parents=True, exist_ok=True)
                    plot_case(plots_dir / name, f"candidate {i + 1}, {r['prompt']}", r, floor_by_prompt.get(r["prompt"]))
                    lines += ["", f"![|delta logprob| per position](plots/{name})"]
                except ImportError:  # e.g. on an NPU host without matplotlib: the figures above remain
                    lines += ["", "(no plot: matplotlib is not installed)"]
            lines.append("")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Command line


def _threshold(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    if not sep or name not in THRESHOLDS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: write NAME=VALUE with NAME one of {', '.join(THRESHOLDS)}")
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: {value!r} is not a number") from None
    if not math.isfinite(number) or number < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the value must be a finite number >= 0")
    return name, number


def _url(text: str) -> str:
    parsed = urllib.parse.urlparse(text)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) base URL, e.g. http://127.0.0.1:8000")
    if parsed.path.rstrip("/").endswith("/v1"):
        raise argparse.ArgumentTypeError(f"{text!r}: give the server's base URL without /v1")
    return text.rstrip("/")


def _reference(text: str) -> str:
    if text.startswith("hf:"):
        path = pathlib.Path(text[3:]).expanduser()
        if not (path / "config.json").is_file():
            raise argparse.ArgumentTypeError(
                f"{text!r}: {path} is not a checkpoint directory (no config.json); write hf:/path/to/checkpoint")
        return f"hf:{path}"
    return _url(text)


def _csv(choices: Sequence[str] | None = None):
    def parse(text: str) -> set[str]:
        items = {x.strip() for x in text.split(",") if x.strip()}
        bad = sorted(items - set(choices)) if choices else []
        if not items or bad:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a comma-separated list of {', '.join(choices or ['ids'])}")
        return items
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minicpmv-parity", description=__doc__.splitlines()[0],
        epilog="thresholds (--threshold NAME=VALUE): " + "; ".join(
            f"{k}={v.default:g} ({v.help})" for k, v in THRESHOLDS.items()))
    parser.add_argument("--reference", required=True, type=_reference,
                        help="hf:/path/to/checkpoint (transformers fp32 on the CPU) or a vLLM base URL")
    parser.add_argument("--candidate", required=True, action="append", type=_url, metavar="URL",
                        help="vLLM base URL to test (repeat for several)")
    parser.add_argument("--floor", type=_url, metavar="URL",
                        help="a second healthy run (vLLM base URL) that sets the noise floor")
    parser.add_argument("--model", help="served model name (default: the first one /v1/models lists)")
    parser.add_argument("--prompts", type=pathlib.Path, metavar="FILE.jsonl", help="extra prompts, one JSON object a line")
    parser.add_argument("--no-builtin", action="store_true", help="use only the prompts from --prompts")
    parser.add_argument("--subset", type=_csv(parity_prompts.SUBSETS), help="only these subsets (comma-separated)")
    parser.add_argument("--prompt", type=_csv(), help="only these prompt ids (comma-separated)")
    parser.add_argument("--max-tokens", type=int, default=64, help="reference continuation length (default 64)")
    parser.add_argument("--free-tokens", type=int, default=16, help="free-running greedy tokens (default 16)")
    parser.add_argument("--threshold", type=_threshold, action="append", default=[], metavar="NAME=VALUE",
                        help="override one threshold (repeatable; names and defaults below)")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("parity-report"),
                        help="report directory: parity.json, parity.md, plots/ (default ./parity-report)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request (default 600)")
    return parser


def _positive_int(parser: argparse.ArgumentParser, name: str, value: int) -> None:
    if value < 1:
        parser.error(f"--{name} must be >= 1, got {value}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    start = time.monotonic()
    thresholds = {k: v.default for k, v in THRESHOLDS.items()} | dict(args.threshold)
    prompts = [] if args.no_builtin else list(parity_prompts.BUILTIN_PROMPTS)
    if args.prompts:
        prompts += parity_prompts.load_jsonl(args.prompts)
    prompts = parity_prompts.select(prompts, args.subset, args.prompt)
    subsets = [s for s in parity_prompts.SUBSETS if any(p.subset == s for p in prompts)]

    try:
        api_key = api_key_from_env(os.environ)
    except ApiKeyError as exc:
        raise ParityUsageError(str(exc)) from exc
    endpoints: dict[str, Endpoint] = {}  # one per URL: a floor equal to a candidate runs once

    def endpoint(url: str, role: str) -> Endpoint:
        if url not in endpoints:
            endpoints[url] = Endpoint(url, args.model, args.timeout, api_key, role)
        return endpoints[url]

    runs = {url: endpoint(url, "candidate") for url in args.candidate}
    if args.floor:
        runs[args.floor] = endpoint(args.floor, "floor")
    ref: HFReference | Endpoint | None = None if args.reference.startswith("hf:") else endpoint(args.reference, "reference")
    with_options = next((p for p in prompts if p.mm_processor_kwargs), None)
    if with_options is not None:  # every server asked before the HF reference loads (minutes)
        for server in endpoints.values():
            server.check_processor_options(with_options)
    if ref is None:
        _log(f"loading the reference {args.reference} (transformers, fp32, CPU)")
        ref = HFReference(pathlib.Path(args.reference[3:]))

    results: dict[str, list[dict[str, Any]]] = {url: [] for url in runs}
    cases_out = []
    for n, prompt in enumerate(prompts, 1):
        t0 = time.monotonic()
        try:
            case = reference_case(ref, prompt, max(args.max_tokens, args.free_tokens))
        except RequestFailed as exc:
            raise ParityUsageError(f"the reference failed on prompt {prompt.id}: {exc}") from exc
        case = dataclasses.replace(case, forced=_trim(case.forced, len(case.greedy.prompt_ids) + args.max_tokens))
        cases_out.append({"id": prompt.id, "subset": prompt.subset, "text": prompt.text,
                          "images": [s.describe() for s in prompt.images],
                          "mm_processor_kwargs": prompt.mm_processor_kwargs,
                          "prompt_tokens": len(case.greedy.prompt_ids),
                          "continuation_tokens": len(case.forced.dists) if case.forced else 0})
        for url, endpoint_run in runs.items():
            results[url].append(compare_case(case, endpoint_run, args.free_tokens, thresholds["confident_gap"]))
        _log(f"[{n}/{len(prompts)}] {prompt.id}: {len(case.greedy.prompt_ids)} prompt ids, "
             f"{cases_out[-1]['continuation_tokens']} teacher-forced positions ({time.monotonic() - t0:.1f} s)")

    floor_results = results[args.floor] if args.floor else None
    floor_by_prompt = {}
    for r in floor_results or []:
        deltas = [p["abs_dlogprob"] for p in r["positions"]]
        floor_by_prompt[r["prompt"]] = {"positions": r["positions"],
                                        "positions_p99": _p99(deltas) if deltas else 0.0}

    def run_report(url: str) -> dict[str, Any]:
        evaluation = evaluate(results[url], floor_results, subsets, thresholds)
        return {"label": url, "model": runs[url].model, "evaluation": evaluation,
                "failing_prompts": failing_prompts(results[url], floor_by_prompt, thresholds),
                "results": results[url]}

    candidates = [run_report(url) for url in args.candidate]
    floor = None
    if args.floor:
        floor = {"label": args.floor, "evaluation": evaluate(floor_results, None, subsets, thresholds),
                 "results": floor_results}
    return {
        "report_version": REPORT_VERSION,
        "prompt_set_version": parity_prompts.PROMPT_SET_VERSION,
        "reference": ref.label,
        "floor": floor,
        "candidates": candidates,
        "thresholds": thresholds,
        "settings": {"max_tokens": args.max_tokens, "free_tokens": args.free_tokens, "top_k": TOP_K},
        "prompts": cases_out,
        "passed": all(c["evaluation"]["passed"] for c in candidates),
        "seconds": time.monotonic() - start,
    }


def _trim(forced: Forced | None, end: int) -> Forced | None:
    """Keep the first --max-tokens positions (the reference generated enough for the free run too)."""
    if forced is None:
        return None
    return Forced(forced.ids, {p: d for p, d in forced.dists.items() if p < end})


def _p99(values: list[float]) -> float:
    import numpy as np

    return float(np.percentile(np.array(values), 99))


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _positive_int(parser, "max-tokens", args.max_tokens)
    _positive_int(parser, "free-tokens", args.free_tokens)
    if args.no_builtin and not args.prompts:
        parser.error("--no-builtin needs --prompts FILE.jsonl")
    try:
        report = run(args)
    except (ParityUsageError, PromptError) as exc:
        print(f"minicpmv-parity: error: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "parity.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "parity.md").write_text(markdown_report(report, args.out))
    print(terminal_table(report))
    print(f"\n{'PASS' if report['passed'] else 'FAIL'}: {len(report['prompts'])} prompts in "
          f"{report['seconds']:.0f} s; report: {args.out / 'parity.md'}, {args.out / 'parity.json'}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
