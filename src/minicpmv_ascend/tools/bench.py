"""Benchmark harness: vLLM's own `vllm bench serve` over a matrix of cells, rooflines, A/B runs.

    minicpmv-bench endpoint --base-url URL --out DIR [matrix options]
        benchmark a running OpenAI-compatible server (this project's, or any vLLM)
    minicpmv-bench ab --checkpoint DIR --a PROFILE --b PROFILE --out DIR [--pairs N] [matrix options]
        start and stop the servers itself, A B A B ..., time to ready and the cells, ratios B/A per pair
    minicpmv-bench roofline [--checkpoint DIR] --out DIR
        this machine's memory bandwidth and bf16 matmul rate, and one decode token's bytes and FLOPs

Every cell is one `python -m minicpmv_ascend.vllm_cli bench serve` run (forked from a process that
has imported it: CELL_PRELOAD; chat endpoint, `random` or
`random-mm` dataset, fixed input/output lengths, `--ignore-eos`, `--max-concurrency`), so the
numbers are vLLM's own definitions of TTFT, TPOT, ITL and throughput; unstreamed cells (`--stream
off`) run the same through tools/bench_client.py, whose chat client can send `"stream": false`. Exact image sizes are a
one-bucket `--random-mm-bucket-config`; the 4x/16x mode and `max_slice_nums` travel per request in
`--extra-body '{"mm_processor_kwargs": ...}'`, which vLLM's chat API accepts; tokens per image come
from the server's own `usage.prompt_tokens` (image cell minus the text cell of the same length).

Output in --out: bench.json (everything), bench.md (tables), plots/*.png, raw/ (vLLM's result
files), logs/ (server logs in A/B mode). Each cell (and each A/B start) records the load average,
how many other vLLM processes were running, and the cores that processes outside the server under
test and this harness used meanwhile (`cpu`, `contended`), because on a shared machine they change
the numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import sys
import time
import urllib.parse
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from minicpmv_ascend.common.api_key import ApiKeyError, api_key_from_env
from minicpmv_ascend.common.http import Client, RequestFailed
from minicpmv_ascend.tools import bench_report, lifecycle, roofline

EXIT_USAGE = 2
PERCENTILES = "50,99"
METRICS = ("ttft", "tpot", "itl", "e2el")
NATIVE_TILE = (448, 448)  # the vision encoder's native image size: one slice, no splitting


class UsageError(Exception):
    """A bad argument: reported in one message, exit code 2."""


# --------------------------------------------------------------------------------------------
# Cells: one `vllm bench serve` run each
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Cell:
    mix: str  # text | image | images | table (the image-size table)
    concurrency: int
    num_prompts: int
    input_len: int
    output_len: int
    images: int = 0
    image_size: tuple[int, int] | None = None  # (width, height)
    mode: str | None = None  # downsample_mode 16x / 4x; None = the checkpoint's default
    max_slices: int | None = None  # max_slice_nums; None = the processor's default
    stream: bool = True  # False: each answer comes whole (bench_client), TTFT = end-to-end latency

    @property
    def name(self) -> str:
        parts = [self.mix]
        if self.images:
            parts.append(f"{self.images}x{self.image_size[0]}x{self.image_size[1]}")
            parts.append(self.mode or "default-mode")
            parts.append(f"slices={self.max_slices if self.max_slices is not None else 'default'}")
        if not self.stream:
            parts.append("no-stream")
        parts.append(f"c={self.concurrency}")
        return " ".join(parts)

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9]+", "_", self.name).strip("_")

    @property
    def seed(self) -> int:
        """`vllm bench serve --seed`: the same for a cell in every run (A and B see the same prompts
        and images), different between cells. One seed for all cells sent the c=4 cell the c=1
        cell's images again, served from the server's multimodal caches (MM cache hit rate 50 %,
        TTFT 2.9 s against 4.3 s at c=1), which hid the vision tower from every cell after the first."""
        return zlib.crc32(self.slug.encode())

    def mm_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if self.mode:
            kwargs["downsample_mode"] = self.mode
        if self.max_slices is not None:
            kwargs["max_slice_nums"] = self.max_slices
        return kwargs

    def bench_args(self, base_url: str, model: str, tokenizer: str, result_dir: pathlib.Path,
                   warmups: int) -> list[str]:
        args = [
            "bench", "serve", "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
            "--base-url", base_url, "--model", model, "--tokenizer", tokenizer,
            "--random-input-len", str(self.input_len), "--random-output-len", str(self.output_len),
            "--ignore-eos", "--num-prompts", str(self.num_prompts),
            "--max-concurrency", str(self.concurrency), "--request-rate", "inf",
            # vLLM's warm-up re-sends request 0: with images that would serve request 0's image from
            # the server's multimodal caches and hide the vision tower from its TTFT.
            "--num-warmups", str(0 if self.images else warmups), "--seed", str(self.seed),
            "--percentile-metrics", ",".join(METRICS), "--metric-percentiles", PERCENTILES,
            "--save-result", "--result-dir", str(result_dir), "--result-filename", f"{self.slug}.json",
            "--disable-tqdm",
        ]
        extra_body: dict[str, Any] = {} if self.stream else {"stream": False}
        if self.mm_kwargs():
            extra_body["mm_processor_kwargs"] = self.mm_kwargs()
        if extra_body:
            args += ["--extra-body", json.dumps(extra_body)]
        if not self.images:
            return args + ["--dataset-name", "random"]
        width, height = self.image_size
        return args + [
            "--dataset-name", "random-mm",
            "--random-mm-base-items-per-request", str(self.images),
            "--random-mm-num-mm-items-range-ratio", "0",
            "--random-mm-limit-mm-per-prompt", json.dumps({"image": self.images, "video": 0}),
            "--random-mm-bucket-config", f"{{({height}, {width}, 1): 1.0}}",
        ]

    @property
    def client_module(self) -> str:
        """vLLM's CLI; for unstreamed cells the same with a client that can send stream: false."""
        return "minicpmv_ascend.vllm_cli" if self.stream else "minicpmv_ascend.tools.bench_client"


def _positive_ints(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{what} {text!r}: expected comma-separated whole numbers, e.g. 1,4,16") from None
    if not values or any(v < 1 for v in values):
        raise UsageError(f"{what} {text!r}: every value must be 1 or more, e.g. 1,4,16")
    return values


def _size(text: str, what: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)[xX](\d+)\s*", text)
    if not match or min(int(match[1]), int(match[2])) < 14:
        raise UsageError(f"{what} {text!r}: expected WIDTHxHEIGHT in pixels (each >= 14), e.g. 1344x1008")
    return int(match[1]), int(match[2])


def _modes(text: str, flag: str = "--modes") -> list[str | None]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("16x", "4x", "default")]
    if not modes or bad:
        raise UsageError(f"{flag} {text!r}: expected a list of 16x, 4x, default (the checkpoint's), e.g. 16x,4x")
    return [None if m == "default" else m for m in modes]


def _slices(text: str) -> list[int | None]:
    out: list[int | None] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part == "default":
            out.append(None)
        elif part.isdigit() and int(part) >= 1:
            out.append(int(part))
        else:
            raise UsageError(f"--slice-nums {text!r}: expected whole numbers >= 1 or 'default', e.g. 1,9,default")
    if not out:
        raise UsageError("--slice-nums is empty: give e.g. 1,9")
    return out


MIXES = ("text", "image", "images")


def _streaming(text: str) -> list[bool]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values or any(v not in ("on", "off") for v in values):
        raise UsageError(f"--stream {text!r}: expected on, off or on,off (streamed answers, whole answers or both)")
    return [v == "on" for v in values]


def build_cells(args: argparse.Namespace) -> list[Cell]:
    """The matrix: mixes x image sizes x modes (image mixes) x streaming x concurrency, then the
    image table at concurrency 1."""
    concurrency = _positive_ints(args.concurrency, "--concurrency")
    mixes = [m.strip() for m in args.mixes.split(",") if m.strip() and m.strip() != "none"]
    unknown = [m for m in mixes if m not in MIXES]
    if unknown:
        raise UsageError(f"--mixes {args.mixes!r}: unknown mix {unknown[0]!r}; choose from {', '.join(MIXES)} "
                         "(or none: only the image table)")
    if args.input_len < 1 or args.output_len < 1:
        raise UsageError("--input-len and --output-len must be 1 or more (tokens)")
    images = [_size(s, "--image-size") for s in args.image_size.split(",") if s.strip()]
    if not images:
        raise UsageError("--image-size is empty: give e.g. 448x448 or 448x448,1344x1008")
    if args.multi_images < 1:
        raise UsageError("--multi-images must be 1 or more (images per request of the `images` mix)")
    image_modes = _modes(args.image_modes, "--image-modes")
    streaming = _streaming(args.stream)

    def prompts(c: int) -> int:
        return args.num_prompts or max(8, 4 * c)

    cells = []
    for mix in mixes:
        n_images = {"text": 0, "image": 1, "images": args.multi_images}[mix]
        variants = [(size, mode) for size in images for mode in image_modes] if n_images else [(None, None)]
        for size, mode in variants:
            for stream in streaming:
                for c in concurrency:
                    cells.append(Cell(mix, c, prompts(c), args.input_len, args.output_len, n_images, size, mode,
                                      stream=stream))
    if args.image_table:
        sizes = [_size(s, "--table-sizes") for s in args.table_sizes.split(",") if s.strip()]
        if not sizes:
            raise UsageError("--table-sizes is empty: give e.g. 448x448,1344x1008")
        n = args.table_prompts
        cells.append(Cell("table", 1, n, args.table_input_len, args.table_output_len))  # text reference
        for size in sizes:
            for mode in _modes(args.modes):
                for slices in _slices(args.slice_nums):
                    cells.append(Cell("table", 1, n, args.table_input_len, args.table_output_len, 1, size,
                                      mode, slices))
    if not cells:
        raise UsageError("no cells: give --mixes (text, image, images) and/or --image-table")
    return cells


# --------------------------------------------------------------------------------------------
# Running one cell, and what the machine was doing meanwhile
# --------------------------------------------------------------------------------------------


def _api_key() -> str | None:
    """The endpoint's API key (VLLM_API_KEY or API_KEY_FILE); a bad setting is a usage error."""
    try:
        return api_key_from_env(os.environ)
    except ApiKeyError as err:
        raise UsageError(str(err)) from None


def _bench_env() -> dict[str, str]:
    env = dict(os.environ)
    key = _api_key()
    if key:  # vLLM's bench client sends OPENAI_API_KEY as the bearer token, read per request
        env["OPENAI_API_KEY"] = key
    return env


# A cell's process first imports vLLM's CLI and bench client: ~14 CPU-seconds (torch, vLLM's
# datasets and LoRA layers) against a few seconds of requests on a small model. Cells are forked
# from one process that has imported them (multiprocessing's fork server, started before the first
# cell's clock), so a sweep pays the import once. What a cell does is still `python -m
# CLIENT_MODULE bench serve ...` (its record's "command"): that module's main() with those
# arguments, the cell's environment, its output in the cell's log, its exit code.
CELL_PRELOAD = ("minicpmv_ascend.tools.bench", "minicpmv_ascend.tools.bench_client", "vllm.benchmarks.serve",
                "vllm.entrypoints.cli.main", "vllm.entrypoints.cli.benchmark.main",
                "vllm.entrypoints.cli.benchmark.serve", "vllm.entrypoints.cli.serve",
                "vllm.entrypoints.cli.openai")


@functools.cache
def _cell_forks() -> Any:
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(CELL_PRELOAD))
    ready = context.Process(target=int)  # returns once the fork server has imported CELL_PRELOAD
    ready.start()
    ready.join()
    return context


def _cell_process(module: str, args: Sequence[str], env: Mapping[str, str], log: str) -> None:
    """The forked cell: `python -m module *args` with `env`, stdout and stderr to `log`."""
    import importlib

    os.environ.clear()
    os.environ.update(env)
    sys.argv = [module, *args]
    file = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for fd in (1, 2):
        os.dup2(file, fd)
    os.close(file)
    # multiprocessing's bootstrap then does what the interpreter would: SystemExit's code is the
    # exit code, an exception's traceback goes to stderr and exits 1, the streams are flushed.
    importlib.import_module(module).main()


def summarise(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers of one vLLM result file that the tables and plots use."""
    out: dict[str, Any] = {k: raw.get(k) for k in (
        "completed", "failed", "duration", "request_throughput", "output_throughput", "total_token_throughput",
        "total_input_tokens", "total_output_tokens")}
    for metric in METRICS:
        for stat in ("mean", "p50", "p99"):
            out[f"{stat}_{metric}_ms"] = raw.get(f"{stat}_{metric}_ms")
    # The server's usage.prompt_tokens (images included); lengths are fixed, so the mean is exact.
    completed = raw.get("completed") or 0
    out["prompt_tokens_per_request"] = round(raw["total_input_tokens"] / completed, 1) if completed else None
    tpot = out.get("p50_tpot_ms")  # ~0 when all tokens of a short answer arrive in one chunk
    out["decode_tokens_per_s_per_request"] = 1000.0 / tpot if tpot and tpot >= 0.1 else None
    return out


def run_cell(cell: Cell, base_url: str, model: str, tokenizer: str, out: pathlib.Path, warmups: int,
             timeout: float, server_pids: Sequence[int] = ()) -> dict[str, Any]:
    """One cell; `server_pids` are the server under test's processes (its CPU is not contention)."""
    raw_dir = out / "raw"
    raw_dir.mkdir(parents=True, exist_ok=True)
    result_file = raw_dir / f"{cell.slug}.json"
    result_file.unlink(missing_ok=True)
    args = cell.bench_args(base_url, model, tokenizer, raw_dir, warmups)
    cmd = [sys.executable, "-m", cell.client_module, *args]  # what the forked cell is
    record: dict[str, Any] = {"name": cell.name, **dataclasses.asdict(cell), "command": shlex.join(cmd),
                              "load_before": lifecycle.machine_load(server_pids)}
    log = raw_dir / f"{cell.slug}.log"
    forks = _cell_forks()
    print(f"[bench] {cell.name}: {cell.num_prompts} requests", file=sys.stderr, flush=True)
    started, cpu_before = time.monotonic(), lifecycle.cpu_snapshot()
    proc = forks.Process(target=_cell_process, args=(cell.client_module, args, _bench_env(), str(log)))
    proc.start()
    try:
        proc.join(timeout)
        returncode = proc.exitcode  # None: still running after `timeout`
    finally:  # after a timeout, or SIGTERM (SystemExit) meanwhile, the cell goes too
        if proc.exitcode is None:
            proc.kill()
            proc.join()
    record["wall_s"] = round(time.monotonic() - started, 1)
    record["cpu"] = lifecycle.cpu_window(cpu_before, lifecycle.cpu_snapshot(), server_pids)
    record["contended"] = bench_report.contended(record)
    record["load_after"] = lifecycle.machine_load(server_pids)
    if returncode != 0 or not result_file.is_file():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        why = "timed out" if returncode is None else f"exited with {returncode}"
        record["error"] = f"vllm bench serve {why}; log {log}:\n{tail}"
        print(f"[bench] {cell.name}: FAILED ({why}), see {log}", file=sys.stderr, flush=True)
        return record
    record["raw_result"] = str(result_file)
    m = summarise(json.loads(result_file.read_text()))
    if m["failed"]:  # vLLM's client prints why; its result file keeps only the count
        errors = re.findall(r"^Error \d+: (.*)$", log.read_text(errors="replace"), re.M)
        record["request_errors"] = errors[:10]
    if not m["completed"]:
        record["error"] = f"all {m['failed']} requests failed: {'; '.join(record.get('request_errors', []))}"
        print(f"[bench] {cell.name}: FAILED, {record['error']}", file=sys.stderr, flush=True)
        return record
    record["metrics"] = m
    print(f"[bench] {cell.name}: {m['output_throughput']:.2f} out tok/s, TTFT p50 {m['p50_ttft_ms']:.0f} ms, "
          f"TPOT p50 {m['p50_tpot_ms']:.1f} ms", file=sys.stderr, flush=True)
    return record


def run_cells(cells: Sequence[Cell], base_url: str, model: str, tokenizer: str, out: pathlib.Path,
              args: argparse.Namespace, server_pids: Sequence[int] = ()) -> list[dict[str, Any]]:
    return [run_cell(c, base_url, model, tokenizer, out, args.warmups, args.cell_timeout, server_pids)
            for c in cells]


def add_image_tokens(records: list[dict[str, Any]]) -> None:
    """Tokens per image: the server's prompt tokens of an image cell minus those of the text cell
    with the same text length, divided by the images per request."""
    text_tokens = {(r["input_len"]): r["metrics"]["prompt_tokens_per_request"]
                   for r in records if not r["images"] and "metrics" in r}
    for r in records:
        base = text_tokens.get(r["input_len"])
        if r["images"] and "metrics" in r and base and r["metrics"]["prompt_tokens_per_request"]:
            r["metrics"]["tokens_per_image"] = round((r["metrics"]["prompt_tokens_per_request"] - base) / r["images"], 1)


# --------------------------------------------------------------------------------------------
# The endpoint under test
# --------------------------------------------------------------------------------------------


def _client(base_url: str, timeout: float) -> Client:
    return Client(base_url.rstrip("/"), timeout, _api_key())


def discover(base_url: str, model: str | None) -> tuple[str, str | None]:
    """(served model name, its checkpoint directory as vLLM reports it in /v1/models `root`)."""
    try:
        data = _client(base_url, 5).get_json("/v1/models")["data"]
    except RequestFailed as err:
        raise UsageError(f"--base-url {base_url}: GET /v1/models failed ({err.reason}); start the server first "
                         "(make serve) or fix the URL") from None
    except (KeyError, TypeError):
        raise UsageError(f"--base-url {base_url}: GET /v1/models failed (the answer is no model list); is it an "
                         "OpenAI-compatible server?") from None
    if not data:
        raise UsageError(f"--base-url {base_url}: /v1/models lists no model")
    chosen = next((m for m in data if m["id"] == model), None) if model else data[0]
    if chosen is None:
        raise UsageError(f"--model {model!r} is not served at {base_url} (it serves "
                         f"{', '.join(m['id'] for m in data)})")
    return chosen["id"], chosen.get("root")


def check_mm_kwargs_accepted(base_url: str, model: str, cells: Sequence[Cell]) -> None:
    """vLLM rejects per-request mm_processor_kwargs unless started with --trust-request-mm-kwargs:
    say so before any cell runs (vLLM's bench client would only report "Bad Request")."""
    if not any(c.mm_kwargs() for c in cells):
        return
    body = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}],
            "mm_processor_kwargs": {"max_slice_nums": 1}}
    try:
        _client(base_url, 120).post_json("/v1/chat/completions", body)
    except RequestFailed as err:
        detail = err.body.decode(errors="replace")
        if err.status == 400 and "mm_processor_kwargs" in detail:
            raise UsageError(f"{base_url} rejects per-request mm_processor_kwargs, which the --modes/--slice-nums "
                             "cells send: start the server with --trust-request-mm-kwargs (e.g. make serve "
                             "ARGS=--trust-request-mm-kwargs), or use --modes default --slice-nums default") from None
        why = f"{err.status}: {detail[:300]}" if err.status else err.reason
        raise UsageError(f"{base_url}: a one-token chat request failed ({why})") from None


def server_under_test(base_url: str, given: Sequence[int]) -> list[int]:
    """The processes of the server under test on this machine: `given` (--server-pid), else those
    listening on the URL's port when it points here. Their CPU time is not contention."""
    import psutil

    missing = [pid for pid in given if not psutil.pid_exists(pid)]
    if missing:
        raise UsageError(f"--server-pid {missing[0]}: no such process; give the pid of the server's API process "
                         "(e.g. from `ps`), or leave it out to find the one listening on the URL's port")
    if given:
        return list(given)
    url = urllib.parse.urlsplit(base_url)
    if url.hostname not in ("127.0.0.1", "localhost", "::1", "0.0.0.0"):
        return []
    return lifecycle.server_pids_on_port(url.port or (443 if url.scheme == "https" else 80))


def _checkpoint_dir(path: str | None, flag: str) -> pathlib.Path | None:
    if path is None:
        return None
    model_dir = pathlib.Path(path).expanduser()
    if not (model_dir / "config.json").is_file():
        raise UsageError(f"{flag} {path}: no config.json there; point it at a checkpoint directory "
                         "(e.g. one made by minicpmv-make-checkpoint)")
    return model_dir


# --------------------------------------------------------------------------------------------
# Rooflines
# --------------------------------------------------------------------------------------------


def hardware_limits(args: argparse.Namespace) -> dict[str, Any]:
    given = {"mem_bandwidth_gbs": args.mem_bandwidth_gbs, "matmul_tflops_bf16": args.matmul_tflops}
    if all(v is not None for v in given.values()):
        return {"source": "given (--mem-bandwidth-gbs, --matmul-tflops)", **given}
    measured = roofline.measure_hardware(threads=args.threads)
    measured["load"] = lifecycle.machine_load()
    for key, value in given.items():
        if value is not None:
            measured[key] = value
            measured["source"] = "measured, partly given"
    return measured


def rooflines(records: Sequence[dict[str, Any]], model_dir: pathlib.Path, hw: Mapping[str, Any]) -> dict[str, Any]:
    """Achieved/ceiling for batch-1 decode (bandwidth) and the largest text batch (compute)."""
    text = [r for r in records if r["mix"] in ("text", "table") and not r["images"] and "metrics" in r]
    context = text[0]["input_len"] + text[0]["output_len"] // 2 if text else 0
    cost = roofline.decode_cost(model_dir, context_tokens=context)
    bw, tflops = hw["mem_bandwidth_gbs"], hw["matmul_tflops_bf16"]
    out: dict[str, Any] = {
        "cost": cost,
        "batch1_bandwidth_ceiling_tok_s": roofline.bandwidth_ceiling(cost, bw),
        "compute_ceiling_tok_s": roofline.compute_ceiling(cost, tflops),
    }
    # The first batch-1 cell that measured decoding (a short answer streamed in one chunk did not).
    single = [r for r in text if r["concurrency"] == 1 and r["metrics"]["decode_tokens_per_s_per_request"]]
    if single:
        achieved = single[0]["metrics"]["decode_tokens_per_s_per_request"]
        out["batch1"] = {"cell": single[0]["name"], "decode_tok_s": achieved,
                         "ceiling_tok_s": out["batch1_bandwidth_ceiling_tok_s"],
                         "ratio": achieved / out["batch1_bandwidth_ceiling_tok_s"] if achieved else None}
    if text:
        big = max(text, key=lambda r: r["concurrency"])
        achieved = big["metrics"]["output_throughput"]
        batch = big["concurrency"]
        bw_ceiling = roofline.bandwidth_ceiling(cost, bw, batch)
        out["large_batch"] = {"cell": big["name"], "output_tok_s": achieved,
                              "compute_ceiling_tok_s": out["compute_ceiling_tok_s"],
                              "ratio_to_compute": achieved / out["compute_ceiling_tok_s"],
                              "bandwidth_ceiling_at_batch_tok_s": bw_ceiling,
                              "ratio_to_bandwidth_at_batch": achieved / bw_ceiling}
    return out


# --------------------------------------------------------------------------------------------
# A/B: servers this harness starts and stops itself
# --------------------------------------------------------------------------------------------

# Settings an operator can pick today (env of entrypoint.py). "tuned" gives vLLM's OpenMP threads
# every core (VLLM_CPU_NUM_OF_RESERVED_CPU=0, the launcher's default on hosts of up to 4 CPUs);
# "reserved" keeps one core for the API server and engine loop, vLLM's own automatic binding and
# the default above 4 CPUs (settings/plan.py; docs/performance.md "CPU binding"). "plain" is vLLM
# without the entrypoint, given exactly the command and environment the entrypoint's plan would
# exec (the same source `entrypoint.py --dry-run` prints).
PROFILES: dict[str, dict[str, Any]] = {
    "seed": {"kind": "entrypoint", "env": {}},
    "tuned": {"kind": "entrypoint", "env": {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}},
    "reserved": {"kind": "entrypoint", "env": {"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}},
    "compiled": {"kind": "entrypoint", "env": {"ENFORCE_EAGER": "false"}},
    # vLLM 0.32 cannot reload its own AOT artifact on the CPU (docs/performance.md): without AOT the
    # model is traced again at each start but inductor's compiled kernels come from its cache.
    "compiled-noaot": {"kind": "entrypoint", "env": {"ENFORCE_EAGER": "false", "VLLM_USE_AOT_COMPILE": "0"}},
    # The Ascend graph profile (the compilation_config setting; docs/deploy-ascend.md): decode-only
    # ACL graphs, as vllm-ascend's CI runs the Qwen3.5-0.8B backbone. Meant for an NPU.
    "decode-graphs": {"kind": "entrypoint",
                      "env": {"ENFORCE_EAGER": "false", "COMPILATION_CONFIG": '{"cudagraph_mode":"FULL_DECODE_ONLY"}'}},
    "plain": {"kind": "plain", "env": {}},
}


def _env_pairs(pairs: Sequence[str], flag: str) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise UsageError(f"{flag} {pair!r}: expected KEY=VALUE, e.g. {flag} VLLM_CPU_OMP_THREADS_BIND=0-1")
        env[key] = value
    return env


@dataclasses.dataclass
class Profile:
    label: str
    kind: str  # entrypoint | plain
    env: dict[str, str]
    args: list[str] = dataclasses.field(default_factory=list)  # vLLM flags of this profile only

    def describe(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.env.items())
        extra = ", ".join(x for x in (env, shlex.join(self.args)) if x)
        return f"{self.label} ({self.kind}{', ' + extra if extra else ''})"


def make_profile(name: str, extra: dict[str, str], label: str, out: pathlib.Path,
                 args: Sequence[str] = ()) -> Profile:
    if name not in PROFILES:
        raise UsageError(f"profile {name!r} is unknown; choose from {', '.join(PROFILES)} "
                         "(and add env with --a-env/--b-env KEY=VALUE)")
    spec = PROFILES[name]
    env = dict(spec["env"]) | extra
    if env.get("ENFORCE_EAGER", "").lower() in ("false", "0", "no"):
        # A compile cache that survives restarts: one directory per profile, kept across its starts.
        env.setdefault("VLLM_CACHE_ROOT", str(out / f"compile-cache-{label}"))
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(pathlib.Path(env["VLLM_CACHE_ROOT"]) / "inductor"))
    return Profile(f"{label}:{name}", spec["kind"], env, list(args))


def server_command(profile: Profile, checkpoint: pathlib.Path, port: int, served: str,
                   extra_args: Sequence[str] = ()) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ) | {"MODEL_PATH": str(checkpoint), "PORT": str(port), "SERVED_MODEL_NAME": served}
    env |= profile.env
    if profile.kind == "entrypoint":
        return lifecycle.entrypoint_command(*extra_args), env
    from minicpmv_ascend import launcher  # the plan entrypoint.py would exec (what --dry-run prints)

    try:
        _, plan = launcher.prepare(list(extra_args), env, generate=False)
    except launcher.ConfigError as err:
        raise UsageError(f"profile {profile.label}: {err}") from None
    return plan.command(sys.executable), plan.exec_env(env)


def _compile_cache_state(log_text: str) -> str:
    """What the compiled start did with its cache, read from vLLM's own log lines."""
    failed = re.search(r"Compiling model again due to a load failure from \S+, reason: (.*)", log_text)
    if failed:
        return f"reload failed: {failed[1].strip()[:200]}"
    if "Directly load AOT compilation" in log_text:
        return "loaded from cache"
    if "Warming up model for the compilation" in log_text or "saved AOT compiled function" in log_text:
        return "compiled"
    return "eager (no compile)"


# Milestones of a vLLM start, in the order they happen, each the first log line matching: the
# start-up breakdown reads their timestamps (vLLM logs whole seconds) against the start.
STARTUP_MILESTONES = (
    ("vllm_imported", r"\(APIServer pid=\d+\) \w+ (\d\d-\d\d \d\d:\d\d:\d\d)"),  # first line of vLLM's
    ("config_resolved", r"Resolved architecture"),
    ("api_mm_warmup_done", r"Multi-modal warmup completed"),
    ("engine_core_started", r"Initializing a V1 LLM engine"),
    ("worker_loading_model", r"Starting to load model"),
    ("weights_loaded", r"Loading weights took"),
    ("mm_profiling", r"Encoder cache will be initialized"),
    ("engine_initialized", r"init engine \(profile, create kv cache, warmup model\) took"),
    ("api_listening", r"Starting vLLM server on"),
)
# Durations vLLM prints itself, in seconds.
STARTUP_DURATIONS = (
    ("api_mm_warmup_s", r"Multi-modal warmup completed in ([\d.]+) ?s"),
    ("model_init_s", r"Initializing model took ([\d.]+) seconds"),
    ("weights_load_s", r"Loading weights took ([\d.]+) seconds"),
    ("engine_init_s", r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
)
_LOG_TIME = re.compile(r"(?:INFO|WARNING|DEBUG|ERROR) (\d\d-\d\d \d\d:\d\d:\d\d) ")


def startup_breakdown(log_text: str, started_wall: float) -> dict[str, Any]:
    """Seconds from the process start (`started_wall`, time.time()) to each STARTUP_MILESTONES
    line of the server log (1 s resolution: vLLM's timestamps), plus the durations vLLM reports."""
    year = time.localtime(started_wall).tm_year
    out: dict[str, Any] = {}
    for key, pattern in STARTUP_MILESTONES:
        for line in log_text.splitlines():
            stamp = _LOG_TIME.search(line)
            if stamp and re.search(pattern, line):
                when = time.mktime(time.strptime(f"{year}-{stamp[1]}", "%Y-%m-%d %H:%M:%S"))
                out[key] = round(when - started_wall, 1)
                break
    for key, pattern in STARTUP_DURATIONS:
        found = re.search(pattern, log_text)
        if found:
            out[key] = float(found[1])
    return out


def start_and_measure(profile: Profile, checkpoint: pathlib.Path, served: str, cells: Sequence[Cell],
                      out: pathlib.Path, index: int, args: argparse.Namespace) -> dict[str, Any]:
    port = lifecycle.free_port()
    cmd, env = server_command(profile, checkpoint, port, served, [*args.server_arg, *profile.args])
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{index:02d}-{profile.label.replace(':', '-')}.log"
    record: dict[str, Any] = {"profile": profile.label, "index": index, "command": shlex.join(cmd),
                              "env": profile.env, "args": profile.args, "log": str(log_path),
                              "load_before": lifecycle.machine_load()}
    print(f"[bench] start #{index} {profile.describe()}", file=sys.stderr, flush=True)
    started, started_wall, cpu_before = time.monotonic(), time.time(), lifecycle.cpu_snapshot()
    proc = lifecycle.start(cmd, log_path, env)
    record["server_pid"] = proc.pid  # also its process group and session id
    base_url = f"http://127.0.0.1:{port}"
    try:
        try:
            ready = lifecycle.wait_ready(proc, base_url, args.ready_timeout, served, _api_key(), started)
        except lifecycle.NotReady as err:
            ready, why = None, str(err)
        record["cpu"] = lifecycle.cpu_window(cpu_before, lifecycle.cpu_snapshot(), [proc.pid])  # the start
        record["contended"] = bench_report.contended(record)
        record["compile_cache"] = _compile_cache_state(log_path.read_text(errors="replace"))
        if ready is None:
            record["error"] = f"server {why}; log {log_path}"
            print(f"[bench] start #{index}: {record['error']}", file=sys.stderr, flush=True)
            return record
        record["ready_s"] = round(ready, 2)
        record["startup"] = startup_breakdown(log_path.read_text(errors="replace"), started_wall)
        record["rss_mib_after_ready"] = lifecycle.session_rss_mib(proc.pid)
        print(f"[bench] start #{index}: ready in {ready:.1f} s, RSS {record['rss_mib_after_ready']} MiB",
              file=sys.stderr, flush=True)
        cell_out = out / f"run{index:02d}"
        record["cells"] = run_cells(cells, base_url, served, str(checkpoint), cell_out, args, [proc.pid])
        record["compile_cache"] = _compile_cache_state(log_path.read_text(errors="replace"))
        return record
    finally:
        lifecycle.stop(proc, timeout=args.stop_timeout)


def _ratio(b: float | None, a: float | None) -> float | None:
    return round(b / a, 3) if a and b is not None else None


def pair_ratios(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    ratios: dict[str, Any] = {"ready_s": _ratio(b.get("ready_s"), a.get("ready_s")),
                              "rss_mib_after_ready": _ratio(b.get("rss_mib_after_ready"), a.get("rss_mib_after_ready"))}
    for ca, cb in zip(a.get("cells", []), b.get("cells", [])):
        ma, mb = ca.get("metrics"), cb.get("metrics")
        if ma and mb:
            ratios[ca["name"]] = {k: _ratio(mb.get(k), ma.get(k)) for k in
                                  ("output_throughput", "p50_tpot_ms", "p50_ttft_ms", "request_throughput")}
    return ratios


def _median(values: Sequence[float]) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def run_ab(args: argparse.Namespace, out: pathlib.Path) -> dict[str, Any]:
    checkpoint = _checkpoint_dir(args.checkpoint, "--checkpoint")
    if checkpoint is None:
        raise UsageError("ab needs --checkpoint DIR (the model both servers load)")
    a = make_profile(args.a, _env_pairs(args.a_env, "--a-env"), "A", out, args.a_arg)
    b = make_profile(args.b, _env_pairs(args.b_env, "--b-env"), "B", out, args.b_arg)
    if args.pairs < 1:
        raise UsageError("--pairs must be 1 or more")
    cells = build_cells(args)
    trusting = all("--trust-request-mm-kwargs" in (*args.server_arg, *p.args) for p in (a, b))
    if any(c.mm_kwargs() for c in cells) and not trusting:
        raise UsageError("the --modes/--slice-nums cells send per-request mm_processor_kwargs, which vLLM refuses "
                         "by default: add --server-arg=--trust-request-mm-kwargs, or use --modes default "
                         "--slice-nums default")
    out.mkdir(parents=True, exist_ok=True)
    for profile in (a, b):  # a fresh run starts with an empty compile cache: the first start is cold
        cache = profile.env.get("VLLM_CACHE_ROOT")
        if cache and args.fresh_cache and pathlib.Path(cache).is_relative_to(out):
            shutil.rmtree(cache, ignore_errors=True)
    starts = []
    for _ in range(args.pairs):
        for profile in (a, b):
            starts.append(start_and_measure(profile, checkpoint, args.served_model_name, cells, out, len(starts), args))
    pairs = [{"pair": i, **pair_ratios(starts[2 * i], starts[2 * i + 1])} for i in range(args.pairs)]
    summary: dict[str, Any] = {"ready_s_ratio_median": _median([p["ready_s"] for p in pairs])}
    for cell in cells:
        summary[cell.name] = {k: _median([p.get(cell.name, {}).get(k) for p in pairs])
                              for k in ("output_throughput", "p50_tpot_ms")}
    return {"a": a.describe(), "b": b.describe(), "starts": starts, "pairs": pairs, "median_ratios_b_over_a": summary,
            "checkpoint": str(checkpoint)}


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def _add_matrix_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("matrix (every cell is one `vllm bench serve` run)")
    g.add_argument("--concurrency", default="1,4,16", help="comma-separated --max-concurrency levels (default 1,4,16)")
    g.add_argument("--mixes", default="text,image,images", help=f"request mixes, from {', '.join(MIXES)}")
    g.add_argument("--input-len", type=int, default=128, help="random text tokens per request (default 128)")
    g.add_argument("--output-len", type=int, default=64, help="generated tokens per request, ignore_eos (default 64)")
    g.add_argument("--num-prompts", type=int, default=0, help="requests per cell (default max(8, 4 x concurrency))")
    g.add_argument("--image-size", default="448x448",
                   help="WIDTHxHEIGHT of the image mixes, comma-separated for several (default 448x448)")
    g.add_argument("--image-modes", default="default",
                   help="downsample modes of the image mixes: 16x, 4x, default (the checkpoint's), comma-separated; "
                        "other than default needs a server started with --trust-request-mm-kwargs (default default)")
    g.add_argument("--multi-images", type=int, default=3, help="images per request of the `images` mix (default 3)")
    g.add_argument("--stream", default="on",
                   help="on: streamed answers (TTFT, ITL); off: whole answers (requests/s, end-to-end latency; "
                        "TTFT is the whole answer); on,off: both (default on)")
    g.add_argument("--warmups", type=int, default=1, help="warm-up requests before each cell (default 1)")
    g.add_argument("--cell-timeout", type=float, default=1800, help="seconds one cell may take (default 1800)")
    t = p.add_argument_group("image table (concurrency 1: TTFT and tokens per image)")
    t.add_argument("--image-table", action="store_true", help="add the image table cells")
    t.add_argument("--table-sizes", default="448x448,1344x1008", help="image sizes (default 448x448,1344x1008)")
    t.add_argument("--modes", default="16x,4x", help="downsample modes: 16x, 4x, default (default 16x,4x)")
    t.add_argument("--slice-nums", default="1,9", help="max_slice_nums values or 'default' (default 1,9)")
    t.add_argument("--table-prompts", type=int, default=3, help="requests per table cell (default 3)")
    t.add_argument("--table-input-len", type=int, default=16, help="text tokens beside the image (default 16)")
    t.add_argument("--table-output-len", type=int, default=8, help="generated tokens (default 8)")


def _add_roofline_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("rooflines (both measured here unless given; on an NPU give both)")
    g.add_argument("--mem-bandwidth-gbs", type=float, help="memory bandwidth in GB/s (skips measuring it)")
    g.add_argument("--matmul-tflops", type=float, help="bf16 matmul rate in TFLOP/s (skips measuring it)")
    g.add_argument("--threads", type=int, default=2, help="torch threads for the measurement (default 2)")
    g.add_argument("--no-roofline", action="store_true", help="skip rooflines (no checkpoint directory at hand)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="minicpmv-bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="{endpoint,ab,roofline}")

    e = sub.add_parser("endpoint", help="benchmark a running OpenAI-compatible server")
    e.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000")
    e.add_argument("--model", help="served model name (default: the first in /v1/models)")
    e.add_argument("--checkpoint", help="checkpoint directory for the tokenizer and rooflines "
                                        "(default: the `root` /v1/models reports, if it is a local directory)")
    e.add_argument("--server-pid", type=int, action="append", default=[], metavar="PID",
                   help="a process of the server under test (repeatable; default: the one listening on the URL's "
                        "port, if local): its CPU time, and its process tree's, is not counted as contention")
    e.add_argument("--out", required=True, help="directory for bench.json, bench.md, plots/")
    _add_matrix_options(e)
    _add_roofline_options(e)

    ab = sub.add_parser("ab", help="start/stop servers: A B A B ..., ratios B/A pair by pair")
    ab.add_argument("--checkpoint", required=True, help="checkpoint directory both servers load")
    ab.add_argument("--a", default="seed", help=f"profile A: {', '.join(PROFILES)} (default seed)")
    ab.add_argument("--b", default="reserved", help="profile B (default reserved: does the default binding beat vLLM's own reservation here?)")
    ab.add_argument("--a-env", action="append", default=[], metavar="KEY=VALUE", help="extra env for A (repeatable)")
    ab.add_argument("--b-env", action="append", default=[], metavar="KEY=VALUE", help="extra env for B (repeatable)")
    ab.add_argument("--a-arg", action="append", default=[], metavar="ARG",
                    help="extra vLLM flag for A only, e.g. --a-arg=--api-server-count=1 (repeatable)")
    ab.add_argument("--b-arg", action="append", default=[], metavar="ARG",
                    help="extra vLLM flag for B only, e.g. --b-arg=--api-server-count=2 or "
                         "--b-arg=--mm-processor-cache-gb=0 (repeatable)")
    ab.add_argument("--pairs", type=int, default=2, help="A/B pairs (default 2)")
    ab.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                    help="extra vLLM flag for both servers, e.g. --server-arg=--trust-request-mm-kwargs (repeatable; "
                         "the entrypoint then checks it with vLLM's parser, ~10 s more to ready)")
    ab.add_argument("--served-model-name", default="minicpm-v-4.6-thinking")
    ab.add_argument("--ready-timeout", type=float, default=900, help="seconds to wait for ready (default 900)")
    ab.add_argument("--stop-timeout", type=float, default=60, help="seconds for a graceful stop (default 60)")
    ab.add_argument("--keep-cache", dest="fresh_cache", action="store_false",
                    help="reuse compile caches already in --out (default: the first compiled start is cold)")
    ab.add_argument("--out", required=True, help="directory for bench.json, bench.md, plots/, logs/")
    _add_matrix_options(ab)
    ab.set_defaults(concurrency="1,4", mixes="text", mem_bandwidth_gbs=None, matmul_tflops=None, threads=2,
                    no_roofline=True)

    r = sub.add_parser("roofline", help="this machine's limits and one decode token's cost")
    r.add_argument("--checkpoint", help="checkpoint directory (for bytes and FLOPs per token)")
    r.add_argument("--out", required=True, help="directory for bench.json and bench.md")
    r.add_argument("--kernel-floor", action="store_true",
                   help="also time one decode step's matrix products alone with vLLM's oneDNN GEMM "
                        "(1 and --threads threads, batch 1 and 16; imports vLLM, needs the weights' RAM)")
    _add_roofline_options(r)
    return p


def _terminate(signum: int, _frame: Any) -> None:
    # SIGTERM would otherwise end Python without unwinding: the servers started here would outlive it.
    raise SystemExit(128 + signum)


def run(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    # Nothing here downloads: the tokenizer and rooflines read the local checkpoint. Set here, not
    # per cell: the cells' fork server reads it when it imports transformers.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = pathlib.Path(args.out)
    try:
        _api_key()  # a bad API key setting stops the run before any server or cell starts
        result: dict[str, Any] = {"kind": args.command, "created": lifecycle.now(), "argv": list(argv or sys.argv[1:]),
                                  "machine": {"cpus": os.cpu_count(), "load_start": lifecycle.machine_load()}}
        if args.command == "endpoint":
            cells = build_cells(args)
            model, root = discover(args.base_url, args.model)
            checkpoint = _checkpoint_dir(args.checkpoint or (root if root and os.path.isdir(root) else None),
                                         "--checkpoint")
            if checkpoint is None:
                raise UsageError(f"the server reports model root {root!r}, not a local directory: pass "
                                 "--checkpoint DIR (the tokenizer and rooflines need it)")
            check_mm_kwargs_accepted(args.base_url, model, cells)
            server_pids = server_under_test(args.base_url, args.server_pid)
            if not server_pids:
                print(f"[bench] no process of this machine listens on {args.base_url} for this user: the server's "
                      "own CPU time counts as other work (contended); pass --server-pid PID", file=sys.stderr)
            out.mkdir(parents=True, exist_ok=True)
            result |= {"base_url": args.base_url, "model": model, "checkpoint": str(checkpoint),
                       "server_pids": server_pids}
            if not args.no_roofline:
                result["hardware"] = hardware_limits(args)
            records = run_cells(cells, args.base_url, model, str(checkpoint), out, args, server_pids)
            add_image_tokens(records)
            result["cells"] = records
            if not args.no_roofline:
                result["rooflines"] = rooflines(records, checkpoint, result["hardware"])
        elif args.command == "ab":
            result["ab"] = run_ab(args, out)
            for start in result["ab"]["starts"]:
                add_image_tokens(start.get("cells", []))
        else:
            checkpoint = _checkpoint_dir(args.checkpoint, "--checkpoint")
            out.mkdir(parents=True, exist_ok=True)
            result["hardware"] = hardware_limits(args)
            if checkpoint:
                result["rooflines"] = rooflines([], checkpoint, result["hardware"])
            if args.kernel_floor:
                if checkpoint is None:
                    raise UsageError("--kernel-floor needs --checkpoint DIR (the weights' shapes)")
                result["kernel_floor"] = [roofline.kernel_floor(checkpoint, threads, batch)
                                          for threads in sorted({1, args.threads}) for batch in (1, 16)]
                result["kernel_floor_load"] = lifecycle.machine_load()
    except UsageError as err:
        print(f"minicpmv-bench: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    result["machine"]["load_end"] = lifecycle.machine_load()
    paths = bench_report.write(result, out)
    print("\n".join(f"[bench] wrote {p}" for p in paths), file=sys.stderr)
    return 0 if bench_report.complete(result) else 1


def main(argv: Sequence[str] | None = None) -> None:
    sys.exit(run(argv))


if __name__ == "__main__":
    main()
