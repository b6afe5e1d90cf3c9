"""The accuracy parity command, run for real: HF transformers fp32 as the reference, real vLLM CPU
servers (bf16) as candidates, the built-in prompt set with PIL-drawn images.

Healthy servers pass. Three servers that are broken for real fail, and the report names the subset
that is broken: a checkpoint whose vision merger is never reached, a server fed different image
preprocessing, and a checkpoint with one corrupted weight tensor. The three start together and are
compared in one parity run beside the healthy shared server, so that the reference (HF fp32) and the
floor are computed once.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

from minicpmv_ascend.tools import parity_prompts
from support.server import OTHER_SERVER_KEY, REPO, SERVER_READY_TIMEOUT_S, clean_env, free_port, start_server

PARITY_TIMEOUT_S = 1200  # the whole built-in set took ~2 min here; generous for a loaded CI machine
# Prompts the shared server accepts (it is started without --trust-request-mm-kwargs, so it refuses
# per-request processor options): text, reasoning, square / non-square / multi-image.
DEFAULT_OPTION_PROMPTS = ("text-greeting,reasoning-arithmetic,image-square-448,image-1084x820,"
                          "multi-image-2,multi-image-2-nonsquare")
# The tiny random checkpoint's logits reach |z| of 32-64, where bf16 steps by 0.25-0.5 nat: a few
# positions whose reference top-1/top-2 gap is below 0.1 nat flip between two healthy runs (measured:
# 98.1% top-1 agreement for HF fp32 vs vLLM bf16 on multi-image, all at gaps < 0.1, no confident
# flip). docs/design/accuracy.md's 98.5% is meant for the released model; here the bar is lowered and the other bars
# (confident flips, floor ratios) carry the check.
TINY_MODEL_THRESHOLDS = ("--threshold", "top1_min=0.95")


def run_parity(out: pathlib.Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    """The command as a user runs it (with `env` set); returns the process and its JSON report
    (None if none)."""
    process = subprocess.run(
        [sys.executable, "-m", "minicpmv_ascend.tools.parity", "--out", str(out), *args],
        cwd=REPO, env=clean_env(**env), capture_output=True, text=True, timeout=PARITY_TIMEOUT_S,
    )
    report_path = out / "parity.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    return process, report


def verdicts(run: dict) -> dict[str, bool]:
    """Subset -> passed, for one run of a report (its floor, or one of its candidates)."""
    return {subset: s["passed"] for subset, s in run["evaluation"]["subsets"].items()}


def failed_checks(run: dict, subset: str) -> set[str]:
    return {c["check"] for c in run["evaluation"]["subsets"][subset]["checks"] if c["passed"] is False}


def copy_checkpoint(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
    shutil.copytree(src, dst)
    return dst


# ---------------------------------------------------------------------------------------------
# Usage errors: exit 2 with a message that says what is wrong and how to fix it


def test_bad_reference_directory_is_a_usage_error(tmp_path):
    process, report = run_parity(tmp_path / "out", "--reference", f"hf:{tmp_path}", "--candidate", "http://127.0.0.1:9")
    assert process.returncode == 2, process.stderr
    assert "no config.json" in process.stderr and "hf:/path/to/checkpoint" in process.stderr
    assert report is None


@pytest.mark.parametrize("url, why", [
    ("localhost:8000", "not an http(s) base URL"),
    ("http://127.0.0.1:8000/v1", "without /v1"),
])
def test_malformed_candidate_url_is_a_usage_error(tmp_path, tiny_config, url, why):
    process, _ = run_parity(tmp_path, "--reference", f"hf:{tiny_config}", "--candidate", url)
    assert process.returncode == 2 and why in process.stderr, process.stderr


def test_unreachable_candidate_is_a_usage_error(tmp_path, tiny_config):
    url = f"http://127.0.0.1:{free_port()}"
    process, _ = run_parity(tmp_path, "--reference", f"hf:{tiny_config}", "--candidate", url)
    assert process.returncode == 2, process.stderr
    assert f"candidate {url}: GET /v1/models failed" in process.stderr and "connection refused" in process.stderr


@pytest.mark.parametrize("threshold, why", [
    ("top1=0.9", "NAME one of"),
    ("top1_min=high", "is not a number"),
    ("top1_min=-1", ">= 0"),
])
def test_bad_threshold_is_a_usage_error(tmp_path, tiny_config, threshold, why):
    process, _ = run_parity(tmp_path, "--reference", f"hf:{tiny_config}", "--candidate", "http://127.0.0.1:9",
                            "--threshold", threshold)
    assert process.returncode == 2 and why in process.stderr, process.stderr


@pytest.mark.parametrize("line, why", [
    ('{"id": "x", "text": "hi"', "not valid JSON"),
    ('{"id": "x"}', "`text` must be a non-empty string"),
    ('{"id": "x", "text": "hi", "colour": 1}', "unknown field(s) colour"),
    ('{"id": "x", "text": "hi", "images": [{"width": 0, "height": 5}]}', "an image must be"),
    ('{"id": "x", "text": "hi", "images": [{"path": "missing.png"}]}', "does not exist"),
    ('{"id": "x", "text": "hi", "mm_processor_kwargs": {"downsample_mode": "8x"}}', "must be one of 16x, 4x"),
    ('{"id": "text-greeting", "text": "hi"}', "defined twice"),
])
def test_bad_prompt_file_line_is_a_usage_error(tmp_path, tiny_config, line, why):
    prompts = tmp_path / "extra.jsonl"
    prompts.write_text('# my prompts\n{"id": "ok", "text": "fine"}\n' + line + "\n")
    process, _ = run_parity(tmp_path / "out", "--reference", f"hf:{tiny_config}", "--candidate",
                            "http://127.0.0.1:9", "--prompts", str(prompts))
    assert process.returncode == 2, process.stderr
    assert why in process.stderr, process.stderr
    if why != "defined twice":
        assert f"{prompts}:3:" in process.stderr  # names the file and line


def test_unknown_prompt_id_and_missing_prompt_file_are_usage_errors(tmp_path, tiny_config):
    common = ("--reference", f"hf:{tiny_config}", "--candidate", "http://127.0.0.1:9")
    process, _ = run_parity(tmp_path, *common, "--prompt", "no-such-prompt")
    assert process.returncode == 2 and "unknown prompt id(s) no-such-prompt" in process.stderr
    process, _ = run_parity(tmp_path, *common, "--no-builtin")
    assert process.returncode == 2 and "--no-builtin needs --prompts" in process.stderr


@pytest.mark.server
def test_server_refusing_per_request_processor_options_is_a_usage_error(tmp_path, tiny_checkpoint, server):
    """vLLM 0.32 refuses per-request mm_processor_kwargs unless started with --trust-request-mm-kwargs:
    the command says so instead of reporting a broken model, before it loads the reference (minutes
    on the released model)."""
    process, _ = run_parity(tmp_path, "--reference", f"hf:{tiny_checkpoint}", "--candidate", server.base_url,
                            "--prompt", "text-greeting,image-4x-1084x820")
    assert process.returncode == 2, process.stderr
    assert "--trust-request-mm-kwargs" in process.stderr and "image-4x-1084x820" in process.stderr
    assert "loading the reference" not in process.stderr


# ---------------------------------------------------------------------------------------------
# Healthy: HF fp32 vs vLLM bf16 passes


@pytest.mark.server
def test_builtin_prompt_set_passes_hf_fp32_vs_vllm_bf16(tmp_path, tiny_checkpoint, other_server):
    """The whole built-in set (4x/16x and per-request slicing need --trust-request-mm-kwargs: the
    second shared server, which also prefills in 64-token chunks and caches prefixes, and wants
    its API key), plus one prompt from a JSONL file with a PNG file of its own."""
    picture = tmp_path / "picture.png"
    parity_prompts.draw_image(300, 200, seed=99).save(picture)
    extra = tmp_path / "extra.jsonl"
    extra.write_text(json.dumps({"id": "jsonl-file-image", "text": "What is this?", "images": [{"path": "picture.png"}]}) + "\n")
    process, report = run_parity(tmp_path / "out", "--reference", f"hf:{tiny_checkpoint}",
                                 "--candidate", other_server.base_url, "--prompts", str(extra), *TINY_MODEL_THRESHOLDS,
                                 VLLM_API_KEY=OTHER_SERVER_KEY)
    print(process.stdout)
    assert process.returncode == 0, process.stdout + process.stderr
    assert report["passed"] and report["prompt_set_version"] == parity_prompts.PROMPT_SET_VERSION
    assert len(report["prompts"]) == len(parity_prompts.BUILTIN_PROMPTS) + 1
    assert verdicts(report["candidates"][0]) == {"text": True, "image": True, "multi-image": True}
    for subset, s in report["candidates"][0]["evaluation"]["subsets"].items():
        m = s["metrics"]
        assert m["prompt_id_mismatches"] == 0 and m["errors"] == 0 and m["confident_flips"] == 0, subset
        # Enough teacher-forced positions to mean something. A continuation ends at the reference's
        # first marker token, which the random model writes after a few dozen tokens (the three
        # multi-image prompts: 76 positions with the tool-calling tokenizer).
        assert m["positions"] >= 60, subset
    assert "PASS" in process.stdout and "multi-image" in process.stdout  # the terminal table
    assert (tmp_path / "out" / "parity.md").read_text().startswith("# Accuracy parity report")


@pytest.mark.server
def test_minicpmv47_hf_fp32_vs_vllm_bf16_passes(tmp_path, tiny_checkpoint_47, server_47):
    """MiniCPM-V 4.7: transformers' own 4.7 model (canvas M-RoPE on every image) against
    the 4.7 server, the default-option prompts (4x's placeholder ids are proven in
    tests/test_minicpmv47.py, its numerics on the same towers by the 4.6 set). Measured once by hand: the same checkpoint
    without `mrope_mode` in config.json (vLLM then places image tokens sequentially) fails the image
    subsets (docs/parity.md, "MiniCPM-V 4.7"), so these positions are what passes here."""
    process, report = run_parity(tmp_path, "--reference", f"hf:{tiny_checkpoint_47}", "--candidate",
                                 server_47.base_url, "--prompt", DEFAULT_OPTION_PROMPTS,
                                 *TINY_MODEL_THRESHOLDS)
    assert process.returncode == 0, process.stdout + process.stderr
    assert report["passed"] and verdicts(report["candidates"][0]) == {"text": True, "image": True, "multi-image": True}
    assert report["reference"].startswith("hf:") and "minicpm-v-4.7" in json.dumps(report["candidates"])


@pytest.mark.server
def test_endpoint_reference_against_itself_is_exact(tmp_path, server):
    """An OpenAI-compatible reference (the user's GPU server, say): the same server as reference and
    candidate gives identical ids and logprobs, so every difference measured elsewhere is real."""
    process, report = run_parity(tmp_path, "--reference", server.base_url, "--candidate", server.base_url,
                                 "--prompt", "text-greeting,image-1084x820")
    assert process.returncode == 0, process.stdout + process.stderr
    assert report["reference"] == server.base_url
    for s in report["candidates"][0]["evaluation"]["subsets"].values():
        m = s["metrics"]
        assert m["positions"] > 0 and m["max_abs_dlogprob"] == 0 and m["top1_agreement"] == 1
        assert m["free_run_identical"] == m["free_runs"] == 1


# ---------------------------------------------------------------------------------------------
# Broken candidates fail, and the report points at the broken subset


def skipped_vision_merger(tiny_checkpoint: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    """insert_layer_id at the vision layer count: the vit_merger is never reached (docs/design/model.md,
    "Vision path")."""
    checkpoint = copy_checkpoint(tiny_checkpoint, out)
    config = json.loads((checkpoint / "config.json").read_text())
    config["insert_layer_id"] = config["vision_config"]["num_hidden_layers"]
    (checkpoint / "config.json").write_text(json.dumps(config))
    return checkpoint


def corrupted_weight(tiny_checkpoint: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    """Noise on one MLP weight of the text model (the kind of damage a bad conversion leaves)."""
    import torch
    from safetensors.torch import load_file, save_file

    checkpoint = copy_checkpoint(tiny_checkpoint, out)
    weights = load_file(checkpoint / "model.safetensors")
    name = "model.language_model.layers.2.mlp.down_proj.weight"
    tensor = weights[name].float()
    generator = torch.Generator().manual_seed(0)
    weights[name] = (tensor + torch.randn(tensor.shape, generator=generator) * tensor.std()).to(weights[name].dtype)
    save_file(weights, checkpoint / "model.safetensors", metadata={"format": "pt"})
    return checkpoint


@pytest.mark.engine(engines=3)
@pytest.mark.server
def test_broken_candidates_fail_on_their_subset_and_a_healthy_one_passes_against_its_floor(
        tmp_path, tiny_checkpoint, server):
    """One parity run, four candidates against HF fp32 with the shared server as the floor (the
    reference and the floor are computed once): the shared server itself passes every bar,
    floor-relative ones included; three servers broken for real fail, each on the subset it breaks:
    a checkpoint whose vision merger is never reached, a server whose image slicing differs
    (max_slice_nums 1 instead of the checkpoint's 9) and a checkpoint with one corrupted weight
    tensor. The three start together."""
    broken = {"no-merger": (skipped_vision_merger(tiny_checkpoint, tmp_path / "no-merger"),),
              "slicing": (tiny_checkpoint, "--mm-processor-kwargs", '{"max_slice_nums": 1}'),
              "corrupted": (corrupted_weight(tiny_checkpoint, tmp_path / "corrupted"),)}
    with contextlib.ExitStack() as stack:
        started = time.monotonic()
        servers = {name: start_server(checkpoint, tmp_path / f"{name}.log", *args)
                   for name, (checkpoint, *args) in broken.items()}
        for srv in servers.values():
            stack.callback(srv.stop)
        for name, srv in servers.items():  # three starts share the two cores: three times one's bound
            srv.wait_ready(timeout=3 * SERVER_READY_TIMEOUT_S)
            print(f"{name} server ready {time.monotonic() - started:.1f} s after the three started")
        candidates = [server.base_url, *(srv.base_url for srv in servers.values())]
        process, report = run_parity(
            tmp_path / "out", "--reference", f"hf:{tiny_checkpoint}", *(f"--candidate={url}" for url in candidates),
            "--floor", server.base_url, "--prompt", DEFAULT_OPTION_PROMPTS, *TINY_MODEL_THRESHOLDS)
    print(process.stdout)
    assert process.returncode == 1, process.stdout + process.stderr
    assert not report["passed"]
    assert [c["label"] for c in report["candidates"]] == candidates
    # The floor (HF fp32 vs the healthy shared server) passes on its own: the failures are the candidates'.
    assert all(verdicts(report["floor"]).values()), verdicts(report["floor"])
    healthy, no_merger, slicing, corrupted = report["candidates"]
    checks = [c for s in healthy["evaluation"]["subsets"].values() for c in s["checks"]]
    assert {c["check"] for c in checks} >= {"median |dlogprob| vs floor", "p99 |dlogprob| vs floor", "top-1 vs floor"}
    assert all(c["passed"] for c in checks) and healthy["evaluation"]["passed"]
    assert verdicts(no_merger) == {"text": True, "image": False, "multi-image": False}
    assert verdicts(slicing) == {"text": True, "image": False, "multi-image": False}
    assert "prompt ids identical" in failed_checks(slicing, "image")
    markdown = (tmp_path / "out" / "parity.md").read_text()
    slicing_section = markdown.split("## Candidate 3:")[1].split("## Candidate 4:")[0]
    assert "image-1084x820" in slicing_section and "token ids differ from index" in slicing_section
    assert verdicts(corrupted)["text"] is False
    assert failed_checks(corrupted, "text") & {"confident flips", "median |dlogprob| vs floor", "p99 |dlogprob| vs floor"}
    plots = list((tmp_path / "out" / "plots").glob("candidate4-*.png"))
    assert plots and all(p.stat().st_size > 1000 for p in plots)  # |delta logprob| per position, failing prompts
