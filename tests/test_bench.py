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

from support.server import REPO, clean_env, http_get

BENCH = [sys.executable, "-m", "minicpmv_ascend.tools.bench"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SMALL = ["--num-prompts", "2", "--input-len", "16", "--output-len", "4", "--warmups", "0"]


def run_bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*BENCH, *args], cwd=REPO, env=clean_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)


def mm_cache_hits(server) -> float:
    """vLLM's multimodal cache hits so far (`vllm:mm_cache_hits_total` on /metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    status, body = http_get(f"{server.base_url}/metrics")
    assert status == 200
    return sum(sample.value for family in text_string_to_metric_families(body.decode())
               for sample in family.samples if sample.name == "vllm:mm_cache_hits_total")


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
    # 64 tokens, not SMALL's 4: an API server starved for ~0.6 s (seen beside the other xdist worker,
    # under scripts/avx2_only) streamed all 4 in one chunk, and a batch-1 cell without a decode rate
    # leaves nothing to put against its ceiling.
    result = run_bench("endpoint", "--base-url", server.base_url, "--out", str(out), *SMALL, "--output-len", "64",
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


@pytest.mark.server
def test_endpoint_streamed_and_unstreamed_cells_of_several_image_sizes(server, tmp_path):
    """The host-side cells: one image of two sizes and a text cell, each streamed and
    unstreamed (vLLM's client can only stream; bench_client sends stream: false). The server under
    test is found by its port, so its CPU time is not counted as contention."""
    out = tmp_path / "bench"
    hits_before = mm_cache_hits(server)
    result = run_bench("endpoint", "--base-url", server.base_url, "--out", str(out), *SMALL, "--concurrency", "2",
                       "--mixes", "text,image", "--image-size", "448x448,1344x1008", "--stream", "on,off",
                       "--no-roofline", timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    # Each cell sends images the server has not seen (a seed per cell): one seed for all sent the
    # streamed cell's images again in the unstreamed one, served from vLLM's multimodal cache.
    assert mm_cache_hits(server) == hits_before
    report = json.loads((out / "bench.json").read_text())
    assert report["server_pids"] == [server.process.pid]
    cells = {c["name"]: c for c in report["cells"]}
    assert list(cells) == ["text c=2", "text no-stream c=2",
                           "image 1x448x448 default-mode slices=default c=2",
                           "image 1x448x448 default-mode slices=default no-stream c=2",
                           "image 1x1344x1008 default-mode slices=default c=2",
                           "image 1x1344x1008 default-mode slices=default no-stream c=2"]
    for name, cell in cells.items():
        assert_cell_sane(cell, 2)
        m = cell["metrics"]
        assert cell["cpu"]["server_processes"] >= 2 and cell["cpu"]["server_cores"] > 0, cell["cpu"]  # API + engine
        if "no-stream" in name:
            assert "minicpmv_ascend.tools.bench_client bench serve" in cell["command"]
            assert '"stream": false' in cell["command"]
            assert m["p50_ttft_ms"] == pytest.approx(m["p50_e2el_ms"], rel=1e-6)  # the answer came whole
        else:
            assert "minicpmv_ascend.vllm_cli bench serve" in cell["command"]
            assert m["p50_ttft_ms"] < m["p50_e2el_ms"]
    small = cells["image 1x448x448 default-mode slices=default no-stream c=2"]["metrics"]["tokens_per_image"]
    large = cells["image 1x1344x1008 default-mode slices=default no-stream c=2"]["metrics"]["tokens_per_image"]
    assert large > 2 * small > 0  # the large image is sliced
    assert "other cores" in (out / "bench.md").read_text()


@pytest.mark.slow  # the roofline reads the weights' shapes: the generated checkpoint
def test_batch1_roofline_skips_a_cell_whose_answer_came_in_one_chunk(tiny_checkpoint):
    """A short answer streamed in one chunk has a TPOT of ~0 and no decode rate (seen on a loaded
    2-core machine with 4-token text cells): the batch-1 roofline takes the next batch-1 cell that
    measured one, not None."""
    from minicpmv_ascend.tools import bench

    def cell(name: str, mix: str, concurrency: int, decode: float | None) -> dict:
        return {"name": name, "mix": mix, "images": 0, "concurrency": concurrency, "input_len": 16,
                "output_len": 4, "metrics": {"decode_tokens_per_s_per_request": decode, "output_throughput": 50.0}}

    records = [cell("text c=1", "text", 1, None), cell("text c=2", "text", 2, None), cell("table c=1", "table", 1, 190.0)]
    roof = bench.rooflines(records, tiny_checkpoint, {"mem_bandwidth_gbs": 40, "matmul_tflops_bf16": 1.5})
    assert roof["batch1"]["cell"] == "table c=1" and roof["batch1"]["ratio"] > 0
    assert roof["large_batch"]["cell"] == "text c=2"


def test_matrix_expresses_the_issue_16_cells():
    """Item 2's host-side cells (sizes, modes, several images, streaming vs not) and item 1's A/B
    matrix are each one command line; the cells carry what vLLM's client needs."""
    from minicpmv_ascend.tools import bench

    args = bench.parser().parse_args([
        "endpoint", "--base-url", "http://127.0.0.1:9", "--out", "x", "--concurrency", "1,16",
        "--mixes", "text,image,images", "--multi-images", "4", "--image-size", "448x448,1344x1008",
        "--image-modes", "16x,4x", "--stream", "on,off"])
    cells = {c.name: c for c in bench.build_cells(args)}
    assert len(cells) == 2 * 2 + 2 * (2 * 2 * 2 * 2)  # text: stream x c; image mixes: size x mode x stream x c
    cell = cells["images 4x1344x1008 4x slices=default no-stream c=16"]
    argv = cell.bench_args("http://127.0.0.1:9", "m", "tok", pathlib.Path("raw"), warmups=1)
    assert cell.client_module == "minicpmv_ascend.tools.bench_client"
    assert json.loads(argv[argv.index("--extra-body") + 1]) == {"stream": False,
                                                                 "mm_processor_kwargs": {"downsample_mode": "4x"}}
    assert argv[argv.index("--random-mm-bucket-config") + 1] == "{(1008, 1344, 1): 1.0}"
    assert argv[argv.index("--random-mm-base-items-per-request") + 1] == "4"
    assert argv[argv.index("--max-concurrency") + 1] == "16" and argv[argv.index("--num-prompts") + 1] == "64"
    streamed = cells["text c=1"]
    assert streamed.client_module == "minicpmv_ascend.vllm_cli"
    assert "--extra-body" not in streamed.bench_args("http://127.0.0.1:9", "m", "tok", pathlib.Path("raw"), 1)

    ab = bench.parser().parse_args(["ab", "--checkpoint", "c", "--out", "x", "--a", "seed", "--b", "tuned", "--pairs",
                                    "3", "--concurrency", "1,4,16", "--mixes", "text,image",
                                    "--b-arg=--api-server-count=2", "--b-env", "LD_PRELOAD=/lib/libtcmalloc.so"])
    assert [c.name for c in bench.build_cells(ab)] == [
        "text c=1", "text c=4", "text c=16", "image 1x448x448 default-mode slices=default c=1",
        "image 1x448x448 default-mode slices=default c=4", "image 1x448x448 default-mode slices=default c=16"]
    assert (ab.a, ab.b, ab.pairs, ab.a_arg, ab.b_arg) == ("seed", "tuned", 3, [], ["--api-server-count=2"])


# Lines of a real vLLM 0.32 start (tiny checkpoint), as the server log has them.
START_LOG = """\
command:
(APIServer pid=8334) INFO 12-01 11:10:59 [api_utils.py:347]        version 0.32.0
(APIServer pid=8334) INFO 12-01 11:11:08 [model.py:733] Resolved architecture: MiniCPMV4_6ForConditionalGeneration
(APIServer pid=8334) INFO 12-01 11:11:11 [base.py:280] Multi-modal warmup completed in 2.296s
(EngineCore pid=8370) INFO 12-01 11:11:16 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: ...
(Worker pid=8395) INFO 12-01 11:11:24 [cpu_model_runner.py:68] Starting to load model /tmp/ckpt...
(Worker pid=8395) INFO 12-01 11:11:25 [base_loader.py:82] Initializing model took 0.117926 seconds
(Worker pid=8395) INFO 12-01 11:11:25 [default_loader.py:501] Loading weights took 0.02 seconds
(EngineCore pid=8370) INFO 12-01 11:11:29 [core.py:402] init engine (profile, create kv cache, warmup model) took 2.94 s
(APIServer pid=8334) INFO 12-01 11:11:31 [entry.py:140] Starting vLLM server on http://0.0.0.0:42777
"""


def test_startup_breakdown_reads_the_milestones_of_vllms_log():
    import time

    from minicpmv_ascend.tools import bench, bench_report

    started = time.mktime(time.strptime(f"{time.localtime().tm_year}-12-01 11:10:50", "%Y-%m-%d %H:%M:%S"))
    breakdown = bench.startup_breakdown(START_LOG, started)
    assert breakdown == {"vllm_imported": 9.0, "config_resolved": 18.0, "api_mm_warmup_done": 21.0,
                         "engine_core_started": 26.0, "worker_loading_model": 34.0, "weights_loaded": 35.0,
                         "engine_initialized": 39.0, "api_listening": 41.0, "api_mm_warmup_s": 2.296,
                         "model_init_s": 0.117926, "weights_load_s": 0.02, "engine_init_s": 2.94}
    table = "\n".join(bench_report.startup_lines([{"index": 0, "startup": breakdown, "ready_s": 41.8}]))
    assert "| 0 | 9.00 | 18.00 |" in table and table.endswith("| 2.94 | 41.80 |")


def test_ab_profile_flags_reach_only_their_server(tiny_config, tmp_path):
    """--a-arg/--b-arg: a vLLM flag A/B'd (e.g. --api-server-count) goes to one profile's command only,
    after the flags both share, in the entrypoint's command (plain `vllm serve`'s: below)."""
    from minicpmv_ascend.tools import bench

    b = bench.make_profile("tuned", {}, "B", tmp_path, ["--api-server-count=2"])
    a = bench.make_profile("seed", {}, "A", tmp_path)
    cmd_b, env_b = bench.server_command(b, tiny_config, 8000, "m", ["--trust-request-mm-kwargs", *b.args])
    cmd_a, _ = bench.server_command(a, tiny_config, 8000, "m", ["--trust-request-mm-kwargs", *a.args])
    assert cmd_b[-2:] == ["--trust-request-mm-kwargs", "--api-server-count=2"] and env_b["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert "--api-server-count=2" not in cmd_a
    assert "--api-server-count=2" in b.describe()


@pytest.mark.slow  # the plain profile's plan is checked with vLLM's serve parser, imported in this process (~5 s)
def test_ab_profile_flags_reach_plain_vllm_serve(tiny_config, tmp_path):
    """--b-arg in plain `vllm serve`'s command (the launcher's plan, as --dry-run prints it)."""
    from minicpmv_ascend.tools import bench

    plain = bench.make_profile("plain", {}, "B", tmp_path, ["--api-server-count=2"])
    cmd_plain, _ = bench.server_command(plain, tiny_config, 8000, "m", plain.args)
    assert "serve" in cmd_plain and "--api-server-count=2" in cmd_plain


# A stand-in for vLLM's bench client, as a cell's module: it says what its process had and got.
CELL_PROBE = """import json, os, sys, time


def main():
    from minicpmv_ascend.tools import bench
    print(json.dumps({"pid": os.getpid(), "parent": os.getppid(), "argv": sys.argv[1:3],
                      "not_preloaded": sorted(set(bench.CELL_PRELOAD) - set(sys.modules)),
                      "key": os.environ.get("OPENAI_API_KEY"), "probe": os.environ["CELL_PROBE"]}), flush=True)
    time.sleep(60 if os.environ["CELL_PROBE"] == "hang" else 0)
    sys.exit(3)
"""
# Two cells and a third that outlives its timeout, through bench.run_cell as a sweep runs them.
RUN_PROBE_CELLS = """import json, os, pathlib, sys
from minicpmv_ascend.tools import bench
bench.Cell.client_module = "cell_probe"
out = pathlib.Path(sys.argv[1])
cell = bench.Cell("text", 1, 1, 8, 4)
records = []
for probe, timeout in (("first", 60), ("second", 60), ("hang", 3)):
    os.environ["CELL_PROBE"] = probe
    records.append(bench.run_cell(cell, "http://127.0.0.1:9", "m", "t", out / probe, 0, timeout))
print(json.dumps(records))
"""


@pytest.mark.slow
def test_cells_are_forked_from_one_process_that_imported_the_client(tmp_path):
    """Each cell runs as `python -m MODULE bench serve ...` would (its argv, the bench's environment
    with the API key as OPENAI_API_KEY, its output in its log, its exit code), forked from one fork
    server that had already imported vLLM's bench client (CELL_PRELOAD: ~14 CPU-s per cell
    otherwise); a cell past its timeout is killed and recorded as timed out."""
    (tmp_path / "cell_probe.py").write_text(CELL_PROBE)
    env = clean_env(PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
                    VLLM_API_KEY="probe-key")
    done = subprocess.run([sys.executable, "-c", RUN_PROBE_CELLS, str(tmp_path / "out")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    records = json.loads(done.stdout.splitlines()[-1])
    seen = [json.loads(next(line for line in r["error"].splitlines() if line.startswith('{"pid"'))) for r in records]
    assert [r["error"].split(";")[0] for r in records] == [
        "vllm bench serve exited with 3", "vllm bench serve exited with 3", "vllm bench serve timed out"], records
    assert [s["probe"] for s in seen] == ["first", "second", "hang"]
    assert all(s["argv"] == ["bench", "serve"] and s["not_preloaded"] == [] and s["key"] == "probe-key"
               for s in seen), seen
    assert len({s["parent"] for s in seen}) == 1 and len({s["pid"] for s in seen}) == 3, seen
    assert all("cell_probe bench serve" in r["command"] for r in records)
    with pytest.raises(ProcessLookupError):  # killed with its parent's run, not left behind
        os.kill(seen[2]["pid"], 0)


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
def test_matmul_measurement_is_bounded_by_its_budget_not_by_the_cpu():
    """The bf16 matmul is sized to the machine: with no budget it stops at the smallest size after
    one product (an AVX2-only CPU spent 15 minutes on best-of-5 4096 products and failed the
    roofline test's limit). The normal case, a budget of seconds, is the roofline command's test."""
    from minicpmv_ascend.tools import roofline

    rate, n = roofline.matmul_rate_bf16(repeats=5, budget_s=0.0)
    assert n == roofline.MATMUL_SIZES[0] and rate > 0


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


@pytest.mark.engine(engines=2)  # one A/B pair: A and B each start once
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


def test_contended_means_other_work_not_the_load_average():
    """A busy server under test raises the load average (5 on 2 cores) without contending with itself;
    the old flag (load > 2.5) marked every such cell. Work outside the server and harness does contend."""
    from minicpmv_ascend.tools import bench_report

    load = {"loadavg": [5.0, 4.0, 3.0], "foreign_vllm_processes": 0}
    cpu = {"seconds": 30.0, "busy_cores": 1.95, "server_cores": 1.6, "harness_cores": 0.3, "other_cores": 0.05}
    busy_server = {"load_before": load, "load_after": load, "cpu": cpu}
    assert bench_report.contended(busy_server) is False
    assert bench_report._load(busy_server) == "5.0 / 0 / 0.05"
    other_work = {**busy_server, "cpu": {**cpu, "server_cores": 0.9, "other_cores": 0.8}}
    assert bench_report.contended(other_work) is True
    assert bench_report._load(other_work) == "5.0 / 0 / 0.80 (contended)"
    assert bench_report.contended({"load_before": load}) is None  # no window: unknown, not quiet


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
    (["endpoint", "--base-url", "http://127.0.0.1:9", "--out", "x", "--stream", "sometimes"],
     "--stream 'sometimes': expected on, off or on,off"),
    (["endpoint", "--base-url", "http://127.0.0.1:9", "--out", "x", "--image-modes", "2x"],
     "--image-modes '2x': expected a list of 16x, 4x, default"),
    (["endpoint", "--base-url", "http://127.0.0.1:9", "--out", "x", "--image-size", "448x448,big"],
     "--image-size 'big': expected WIDTHxHEIGHT"),
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
