"""Reports of a benchmark run (minicpmv_ascend.tools.bench): bench.json, bench.md and plots/*.png."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


# A measurement is contended when processes other than the server under test and this harness used
# more than this many cores on average over its window. Not the load average: it counts the server
# under test itself, so every cell of a busy server looked contended.
CONTENDED_OTHER_CORES = 0.25


def contended(record: Mapping[str, Any]) -> bool | None:
    """Whether other work competed with this cell or start (None: no CPU window recorded)."""
    cpu = record.get("cpu")
    return None if not cpu else cpu["other_cores"] > CONTENDED_OTHER_CORES


def _load(record: Mapping[str, Any]) -> str:
    before, after = record.get("load_before") or {}, record.get("load_after") or {}
    load = max((before.get("loadavg") or [0])[0], (after.get("loadavg") or [0])[0])
    others = max(before.get("foreign_vllm_processes", 0), after.get("foreign_vllm_processes", 0))
    cpu = record.get("cpu")
    other_cores = f"{cpu['other_cores']:.2f}" if cpu else "-"
    flag = " (contended)" if contended(record) else ""
    return f"{load:.1f} / {others} / {other_cores}{flag}"


def all_cells(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    cells = list(result.get("cells", []))
    for start in (result.get("ab") or {}).get("starts", []):
        cells += start.get("cells", [])
    return cells


def complete(result: Mapping[str, Any]) -> bool:
    """Every cell produced numbers with no failed request, and every A/B start became ready."""
    cells_ok = all("metrics" in c and not c["metrics"].get("failed") for c in all_cells(result))
    starts_ok = all("ready_s" in s for s in (result.get("ab") or {}).get("starts", []))
    return cells_ok and starts_ok


CELL_HEADER = ("| cell | req | out tok/s | req/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | ITL p50 / p99 ms "
               "| decode tok/s per req | prompt tok/req | tok/image | load 1 min / other vLLM / other cores |")


def cell_rows(cells: Iterable[Mapping[str, Any]]) -> list[str]:
    rows = [CELL_HEADER, "|" + "---|" * (CELL_HEADER.count("|") - 1)]
    for c in cells:
        m = c.get("metrics")
        if not m:
            rows.append(f"| {c['name']} | FAILED: {c.get('error', '?').splitlines()[0]} |" + " |" * 9)
            continue
        failed = f" ({m['failed']} failed)" if m.get("failed") else ""
        rows.append(
            f"| {c['name']} | {m['completed']}{failed} | {_fmt(m['output_throughput'])} | {_fmt(m['request_throughput'], 2)} "
            f"| {_fmt(m['p50_ttft_ms'], 0)} / {_fmt(m['p99_ttft_ms'], 0)} | {_fmt(m['p50_tpot_ms'])} / {_fmt(m['p99_tpot_ms'])} "
            f"| {_fmt(m['p50_itl_ms'])} / {_fmt(m['p99_itl_ms'])} | {_fmt(m['decode_tokens_per_s_per_request'])} "
            f"| {_fmt(m['prompt_tokens_per_request'])} | {_fmt(m.get('tokens_per_image'))} | {_load(c)} |")
    return rows


def roofline_lines(result: Mapping[str, Any]) -> list[str]:
    hw, roof = result.get("hardware"), result.get("rooflines")
    lines: list[str] = []
    if hw:
        lines += ["## Hardware limits", "",
                  f"- memory bandwidth: **{hw['mem_bandwidth_gbs']} GB/s**; bf16 matmul: **{hw['matmul_tflops_bf16']} "
                  f"TFLOP/s** ({hw.get('source')}{'; ' + hw['how'] if hw.get('how') else ''})"]
        if hw.get("mem_bandwidth_1thread_gbs"):
            lines.append(f"- one thread alone reads {hw['mem_bandwidth_1thread_gbs']} GB/s; a copy moves "
                         f"{hw['mem_copy_gbs']} GB/s (read + write)")
        if hw.get("load"):
            lines.append(f"- measured at load {hw['load']['loadavg'][0]} with {hw['load']['foreign_vllm_processes']} "
                         "other vLLM processes running")
        lines.append("")
    if roof:
        cost = roof["cost"]
        lines += ["## Rooflines", "",
                  f"Per decoded token (batch 1, context {cost['context_tokens']}): "
                  f"{cost['bytes_per_token'] / 1e9:.3f} GB read = layers {cost['layer_weight_bytes'] / 1e9:.3f} + "
                  f"output matrix {cost['output_matrix_bytes'] / 1e9:.3f}{' (tied)' if cost['output_matrix_tied'] else ''} + "
                  f"linear-attention state {cost['linear_state_bytes'] / 1e6:.1f} MB ({cost['linear_state_dtype']}, read+write) + "
                  f"KV {cost['kv_cache_bytes'] / 1e6:.1f} MB; {cost['flops_per_token'] / 1e9:.3f} GFLOP.", "",
                  "| limit | ceiling tok/s | achieved tok/s | achieved / ceiling | cell |", "|---|---|---|---|---|",
                  f"| batch-1 decode, memory bandwidth | {_fmt(roof['batch1_bandwidth_ceiling_tok_s'])} | "
                  f"{_fmt((roof.get('batch1') or {}).get('decode_tok_s'))} | {_fmt((roof.get('batch1') or {}).get('ratio'), 3)} | "
                  f"{(roof.get('batch1') or {}).get('cell', '-')} |"]
        big = roof.get("large_batch")
        if big:
            lines += [f"| large batch, bf16 compute | {_fmt(big['compute_ceiling_tok_s'])} | {_fmt(big['output_tok_s'])} | "
                      f"{_fmt(big['ratio_to_compute'], 3)} | {big['cell']} |",
                      f"| same batch, memory bandwidth (weights shared by the batch) | "
                      f"{_fmt(big['bandwidth_ceiling_at_batch_tok_s'])} | {_fmt(big['output_tok_s'])} | "
                      f"{_fmt(big['ratio_to_bandwidth_at_batch'], 3)} | {big['cell']} |"]
        lines.append("")
    return lines


def startup_lines(starts: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each start's breakdown: seconds from the process start to each milestone of vLLM's log
    (whole seconds), and the durations vLLM reports."""
    keys: list[str] = []
    for s in starts:
        keys += [k for k in s.get("startup", {}) if k not in keys]
    if not keys:
        return []
    header = "| start | " + " | ".join(keys) + " | ready s |"
    lines = ["", "Start-up breakdown (milestones: s since the process start, from vLLM's log, 1 s resolution; "
             "`*_s`: durations vLLM reports):", "", header, "|" + "---|" * (header.count("|") - 1)]
    for s in starts:
        startup = s.get("startup", {})
        lines.append(f"| {s['index']} | " + " | ".join(_fmt(startup.get(k), 2) for k in keys)
                     + f" | {_fmt(s.get('ready_s'), 2)} |")
    return lines


def ab_lines(ab: Mapping[str, Any]) -> list[str]:
    lines = ["## A/B", "", f"- A = {ab['a']}", f"- B = {ab['b']}", "",
             "| start | profile | ready s | RSS MiB | compile cache | load 1 min / other vLLM / other cores |", "|---|---|---|---|---|---|"]
    for s in ab["starts"]:
        lines.append(f"| {s['index']} | {s['profile']} | {_fmt(s.get('ready_s'), 2)} | {_fmt(s.get('rss_mib_after_ready'))} "
                     f"| {s.get('compile_cache', '-')} | {_load(s)} |")
    lines += startup_lines(ab["starts"])
    lines += ["", "Ratios B/A pair by pair (throughput > 1: B faster; TPOT, TTFT, ready < 1: B faster):", ""]
    names = [c["name"] for c in (ab["starts"][0].get("cells") or [])]
    header = "| pair | ready s | RSS | " + " | ".join(f"{n}: out tok/s, TPOT p50" for n in names) + " |"
    lines += [header, "|" + "---|" * (header.count("|") - 1)]
    for p in ab["pairs"]:
        per_cell = [f"{_fmt((p.get(n) or {}).get('output_throughput'), 3)}, {_fmt((p.get(n) or {}).get('p50_tpot_ms'), 3)}"
                    for n in names]
        lines.append(f"| {p['pair']} | {_fmt(p['ready_s'], 3)} | {_fmt(p['rss_mib_after_ready'], 3)} | " + " | ".join(per_cell) + " |")
    lines.append("")
    for s in ab["starts"]:
        if s.get("cells"):
            lines += [f"### start {s['index']}: {s['profile']}", "", *cell_rows(s["cells"]), ""]
        elif s.get("error"):
            lines += [f"### start {s['index']}: {s['profile']}", "", f"FAILED: {s['error']}", ""]
    return lines


def markdown(result: Mapping[str, Any]) -> str:
    lines = [f"# Benchmark ({result['kind']}, {result['created']})", "",
             f"Command: `minicpmv-bench {' '.join(result['argv'])}`", ""]
    if result.get("base_url"):
        lines += [f"Endpoint {result['base_url']}, model `{result['model']}`, checkpoint `{result['checkpoint']}`.", ""]
    if result.get("cells"):
        lines += ["## Cells", "", *cell_rows(result["cells"]), ""]
    lines += roofline_lines(result)
    if result.get("kernel_floor"):
        lines += ["## Decode-step floor: the matrix products alone (vLLM's oneDNN GEMM)", "",
                  "| threads | batch | step ms | tokens/s | effective GB/s |", "|---|---|---|---|---|"]
        lines += [f"| {k['threads']} | {k['batch']} | {k['step_ms']} | {k['tokens_per_s']} | {k['effective_gbs']} |"
                  for k in result["kernel_floor"]]
        lines.append("")
    if result.get("ab"):
        lines += ab_lines(result["ab"])
    lines += ["Load: 1-minute load average (it includes the server under test) / vLLM processes that are neither "
              "under test nor started by this run / cores used on average by every process outside the server under "
              f"test and this harness during the cell (or start); 'contended' marks more than {CONTENDED_OTHER_CORES} "
              "other cores.", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------------


def _plots(result: Mapping[str, Any], plots: pathlib.Path) -> list[pathlib.Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots.mkdir(parents=True, exist_ok=True)
    written = []
    cells = [c for c in all_cells(result) if c.get("metrics")]
    matrix = [c for c in cells if c["mix"] != "table"]
    roof = result.get("rooflines") or {}

    if matrix:  # throughput vs concurrency, one line per mix (and per A/B profile)
        fig, ax = plt.subplots(figsize=(7, 4.5))
        series: dict[str, list[tuple[int, float]]] = {}
        for start in (result.get("ab") or {}).get("starts", []) or [{"profile": "", "cells": result.get("cells", [])}]:
            for c in start.get("cells", []):
                if c.get("metrics") and c["mix"] != "table":
                    variant = c["name"].rsplit(" c=", 1)[0]  # mix, image size and mode, streaming
                    key = f"{start['profile']} {variant}".strip() + (f" #{start['index']}" if "index" in start else "")
                    series.setdefault(key, []).append((c["concurrency"], c["metrics"]["output_throughput"]))
        for key, points in series.items():
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=key)
        if roof.get("batch1_bandwidth_ceiling_tok_s"):
            ax.axhline(roof["batch1_bandwidth_ceiling_tok_s"], ls="--", color="gray", label="batch-1 bandwidth ceiling")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (--max-concurrency)")
        ax.set_ylabel("output tokens/s")
        ax.set_title("Throughput vs concurrency")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        written.append(_save(fig, plots / "throughput_vs_concurrency.png"))

    if cells:  # latency percentiles per cell
        fig, axes = plt.subplots(1, 3, figsize=(12, 0.35 * len(cells) + 2), sharey=True)
        labels = [c["name"] for c in cells]
        ys = range(len(cells))
        for ax, metric in zip(axes, ("ttft", "tpot", "itl")):
            p50 = [c["metrics"].get(f"p50_{metric}_ms") or 0 for c in cells]
            p99 = [c["metrics"].get(f"p99_{metric}_ms") or 0 for c in cells]
            ax.barh([y + 0.2 for y in ys], p99, height=0.4, label="p99", color="tab:orange")
            ax.barh([y - 0.2 for y in ys], p50, height=0.4, label="p50", color="tab:blue")
            ax.set_xlabel(f"{metric.upper()} ms")
            ax.grid(alpha=0.3, axis="x")
        axes[0].set_yticks(list(ys), labels, fontsize=7)
        axes[0].legend(fontsize=7)
        fig.suptitle("Latency percentiles")
        written.append(_save(fig, plots / "latency_percentiles.png"))

    table = [c for c in cells if c["mix"] == "table" and c["images"]]
    if table:  # image TTFT vs slices: x = image tokens (slices x tokens per slice)
        fig, ax = plt.subplots(figsize=(7, 4.5))
        groups: dict[str, list[tuple[float, float, str]]] = {}
        for c in table:
            key = f"{c['image_size'][0]}x{c['image_size'][1]} {c['mode'] or 'default'}"
            tokens = c["metrics"].get("tokens_per_image") or 0
            slices = c["max_slices"] if c["max_slices"] is not None else "default"
            groups.setdefault(key, []).append((tokens, c["metrics"]["p50_ttft_ms"] / 1000, f"s={slices}"))
        for key, points in groups.items():
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=key)
            for x, y, text in points:
                ax.annotate(text, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel("tokens per image (max_slice_nums annotated)")
        ax.set_ylabel("TTFT p50 (s)")
        ax.set_title("Image TTFT vs slices")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        written.append(_save(fig, plots / "image_ttft_vs_slices.png"))
    return written


def _save(fig: Any, path: pathlib.Path) -> pathlib.Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(result: Mapping[str, Any], out: pathlib.Path) -> Sequence[pathlib.Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "bench.json", out / "bench.md"
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    md_path.write_text(markdown(result))
    return [json_path, md_path, *_plots(result, out / "plots")]
