"""The benchmark harness (minicpmv_ascend.tools.bench) against the real vLLM CPU server, tiny checkpoint.

Smoke runs only: they check that every cell ran through vLLM's own `vllm bench serve` and that the
JSON, Markdown and plots hold complete, sane numbers. No timing assertions: speed on a shared
2-core machine is not a property of the code.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import REPO, clean_env

BENCH = [sys.executable, "-m", "minicpmv_ascend.tools.bench"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SMALL = ["--num-prompts", "2", "--input-len", "16", "--output-len", "4", "--warmups", "0"]


def run_bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*BENCH, *args], cwd=REPO, env=clean_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)


def assert_cell_sane(cell: dict, prompts: int) -> None:
    assert "error" not in cell, cell.get("error")
    m = cell["metrics"]
    assert m["completed"] == prompts and not m["failed"], m
    for key in ("output_throughput", "request_throughput", "p50_ttft_ms", "p99_ttft_ms", "prompt_tokens_per_request"):
        assert isinstance(m[key], (int, float)) and m[key] > 0 and math.isfinite(m[key]), (key, m)
    assert m["p99_ttft_ms"] >= m["p50_ttft_ms"]
    assert m["total_output_tokens"] == prompts * cell["output_len"]  # ignore_eos: fixed lengths
    load = cell["load_before"]
    assert len(load["loadavg"]) == 3 and load["foreign_vllm_processes"] >= 0


def assert_pngs(out: pathlib.Path, *names: str) -> None:
    for name in names:
        data = (out / "plots" / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, name


@pytest.mark.server
def test_endpoint_matrix_image_table_and_rooflines(server, tmp_path):
    out = tmp_path / "bench"
    result = run_bench("endpoint", "--base-url", server.base_url, "--out", str(out), *SMALL,
                       "--concurrency", "1,2", "--mixes", "text",
                       "--image-table", "--table-sizes", "448x448", "--modes", "default", "--slice-nums", "default",
                       "--table-prompts", "1", "--table-output-len", "2",
                       # given limits: the measurement itself is covered by test_roofline_command
                       "--mem-bandwidth-gbs", "40", "--matmul-tflops", "1.5")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "bench.json").read_text())
    cells = {c["name"]: c for c in report["cells"]}
    assert list(cells) == ["text c=1", "text c=2", "table c=1", "table 1x448x448 default-mode slices=default c=1"]
    for cell in cells.values():
        assert_cell_sane(cell, cell["num_prompts"])
        assert json.loads(pathlib.Path(cell["raw_result"]).read_text())["completed"] == cell["num_prompts"]
    assert cells["table 1x448x448 default-mode slices=default c=1"]["metrics"]["tokens_per_image"] > 0
    # vLLM's own command line drove every cell.
    assert all("minicpmv_ascend.vllm_cli bench serve" in c["command"] and "--ignore-eos" in c["command"]
               for c in cells.values())

    roof = report["rooflines"]
    assert report["hardware"]["mem_bandwidth_gbs"] == 40 and report["hardware"]["source"].startswith("given")
    assert roof["cost"]["bytes_per_token"] > roof["cost"]["weight_bytes"] > 0
    assert roof["batch1"]["ratio"] > 0 and roof["large_batch"]["ratio_to_compute"] > 0
    assert roof["large_batch"]["cell"] == "text c=2"

    md = (out / "bench.md").read_text()
    assert all(name in md for name in cells) and "## Rooflines" in md
    assert_pngs(out, "throughput_vs_concurrency.png", "latency_percentiles.png", "image_ttft_vs_slices.png")


@pytest.mark.slow
def test_roofline_command_measures_this_machine(tiny_checkpoint, tmp_path):
    result = run_bench("roofline", "--checkpoint", str(tiny_checkpoint), "--out", str(tmp_path), "--threads", "1",
                       timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "bench.json").read_text())
    hw = report["hardware"]
    assert hw["source"] == "measured" and hw["mem_bandwidth_gbs"] > 0.5 and hw["matmul_tflops_bf16"] > 0.001
    assert report["rooflines"]["batch1_bandwidth_ceiling_tok_s"] > 0
    assert "## Hardware limits" in (tmp_path / "bench.md").read_text()


@pytest.mark.slow
def test_decode_cost_counts_the_language_model_weights(tiny_checkpoint):
    """Bytes per token against an independent count: every tensor of the text model, read with safetensors."""
    from safetensors import safe_open

    from minicpmv_ascend.tools import roofline

    total = 0
    with safe_open(str(tiny_checkpoint / "model.safetensors"), "pt") as f:
        for name in f.keys():
            if name.startswith(("model.language_model.layers.", "model.language_model.norm.", "lm_head.")):
                tensor = f.get_tensor(name)
                total += tensor.numel() * tensor.element_size()
    cost = roofline.decode_cost(tiny_checkpoint, context_tokens=100)
    hidden = json.loads((tiny_checkpoint / "config.json").read_text())["text_config"]["hidden_size"]
    assert cost["weight_bytes"] == total + hidden * 2  # + the one embedding row a token reads
    assert cost["kv_cache_bytes"] == 100 * cost["kv_bytes_per_context_token"] > 0
    assert cost["linear_state_bytes"] > 0 and cost["flops_per_token"] > 2 * cost["language_model_params"] - 1


@pytest.mark.server
def test_per_request_mm_kwargs_need_a_trusting_server(server, tmp_path):
    """vLLM refuses per-request mm_processor_kwargs by default: the harness says how to fix it, up front."""
    result = run_bench("endpoint", "--base-url", server.base_url, "--out", str(tmp_path / "b"), "--mixes", "none",
                       "--image-table", "--modes", "4x", "--no-roofline", timeout=120)
    assert result.returncode == 2, result
    assert "rejects per-request mm_processor_kwargs" in result.stderr and "--trust-request-mm-kwargs" in result.stderr
    assert not (tmp_path / "b").exists()


@pytest.mark.engine
def test_ab_entrypoint_vs_plain_vllm_serve_with_image_modes(tiny_checkpoint, tmp_path):
    """One A/B pair: both servers start, serve a 4x-mode image cell, and are stopped with their whole
    process group. The plain one is `vllm serve` with the command the entrypoint's plan execs."""
    out = tmp_path / "ab"
    result = run_bench("ab", "--checkpoint", str(tiny_checkpoint), "--a", "seed", "--b", "plain", "--pairs", "1",
                       "--server-arg=--trust-request-mm-kwargs", "--mixes", "none", "--image-table",
                       "--table-sizes", "448x448", "--modes", "4x", "--slice-nums", "1", "--table-prompts", "1",
                       "--table-output-len", "4", "--warmups", "0", "--ready-timeout", "300", "--out", str(out),
                       timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    ab = json.loads((out / "bench.json").read_text())["ab"]
    a, b = ab["starts"]
    assert a["profile"] == "A:seed" and "entrypoint.py" in a["command"]
    assert b["profile"] == "B:plain" and "minicpmv_ascend.vllm_cli serve" in b["command"]
    assert "entrypoint.py" not in b["command"] and "--trust-request-mm-kwargs" in b["command"]
    for start in (a, b):
        assert start["ready_s"] > 0 and start["rss_mib_after_ready"] > 100
        assert start["compile_cache"] == "eager (no compile)"
        for cell in start["cells"]:
            assert_cell_sane(cell, 1)
        # The mode reached the server per request: a 448x448 tile is 32x32 patches, merged 2x2 into
        # 256 tokens in 4x mode; the checkpoint's default 16x mode merges again, to 64 (+ layout tokens).
        image_cell = next(c for c in start["cells"] if c["images"])
        assert 256 <= image_cell["metrics"]["tokens_per_image"] < 300, image_cell["metrics"]
        assert pathlib.Path(start["log"]).read_text()
    pair = ab["pairs"][0]
    assert pair["ready_s"] > 0 and pair["table 1x448x448 4x slices=1 c=1"]["output_throughput"] > 0
    assert "## A/B" in (out / "bench.md").read_text()
    assert_pngs(out, "latency_percentiles.png", "image_ttft_vs_slices.png")
    # Stopped for good: no process of either server's session is left.
    alive = [p for p in os.listdir("/proc") if p.isdigit() and _session(int(p)) in {_pid_of(a), _pid_of(b)}]
    assert not alive


def _pid_of(start: dict) -> int:
    return start["server_pid"]


def _session(pid: int) -> int | None:
    try:
        return int(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])
    except (OSError, IndexError, ValueError):
        return None


@pytest.mark.parametrize(("args", "message"), [
    (["endpoint", "--base-url", "http://127.0.0.1:9", "--out", "x", "--concurrency", "0"],
     "--concurrency '0': every value must be 1 or more"),
    (["endpoint", "--base-url", "http://127.0.0.1:9", "--out", "x", "--mixes", "video"],
     "unknown mix 'video'; choose from text, image, images"),
    (["endpoint", "--base-url", "http://127.0.0.1:9", "--out", "x", "--image-table", "--table-sizes", "448"],
     "expected WIDTHxHEIGHT in pixels"),
    (["endpoint", "--base-url", "http://127.0.0.1:9", "--out", "x", "--image-table", "--modes", "8x"],
     "expected a list of 16x, 4x, default"),
    (["endpoint", "--base-url", "http://127.0.0.1:9", "--out", "x"],
     "GET /v1/models failed"),
    (["ab", "--checkpoint", "/nonexistent", "--out", "x"], "no config.json there"),
    (["ab", "--checkpoint", str(REPO / "tests"), "--out", "x"], "no config.json there"),
    (["endpoint", "--out", "x"], "the following arguments are required: --base-url"),
])
def test_bad_arguments_exit_2_with_a_clear_message(args, message, tmp_path):
    args = [str(tmp_path / "x") if a == "x" else a for a in args]
    result = run_bench(*args, timeout=60)
    assert result.returncode == 2, result
    assert message in result.stderr
    assert not (tmp_path / "x" / "bench.json").exists()


def test_bad_profile_and_env_exit_2(tiny_config, tmp_path):
    result = run_bench("ab", "--checkpoint", str(tiny_config), "--a", "fast", "--out", str(tmp_path), timeout=60)
    assert result.returncode == 2 and "profile 'fast' is unknown; choose from seed" in result.stderr
    result = run_bench("ab", "--checkpoint", str(tiny_config), "--b-env", "NOEQUALS", "--out", str(tmp_path),
                       timeout=60)
    assert result.returncode == 2 and "--b-env 'NOEQUALS': expected KEY=VALUE" in result.stderr
