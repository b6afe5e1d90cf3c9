"""The vLLM plugin (plugin/minicpmv_ascend_plugin) on the project's vLLM CPU stack (vLLM 0.32).

Here vLLM has every upstream fix, so the plugin must load in each vLLM process and apply no
backport; the Ascend RoPE config it would apply on an NPU must be an exact no-op; its reasoning
parser table must be vLLM 0.32's own `minicpmv` behaviour; and the check script for NPU users
must work. The backports themselves are tested against each Ascend target's own vLLM code in
plugin/tests (`make test` runs them in .venv-vllm030 and .venv-vllm023). This file is also the
plugin's proof for the pre-release target v0.32.0rc1, whose vLLM release is this stack's
(deploy/ascend-targets.yaml `test_lock: requirements/cpu.lock`; docs/design/ascend-stack.md).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

import reasoning_harness
from minicpmv_ascend_plugin import PATCHES
from minicpmv_ascend_plugin.core.patch import AT_MODEL_IMPORT
from minicpmv_ascend_plugin.patches.model import gdn_one_token_prefill
from support import raw_http
from support.cpu import CPU_RUNS_THE_CONV_KERNEL
from support.server import REPO, clean_env, http_get, start_server

# What vLLM 0.32 (this CPU stack) does not need, the one hand-kept claim here (as plugin/tests/
# _target.py NEEDED is per target): the model backports of fixes it has, and the register-time
# patches it skips, with the reason each gives. Every other patch is expected applied, in the
# plugin's order (a new patch that 0.32 needs too changes nothing here).
BACKPORTS = ("processor-version", "image-size-order", "vit-merger-flags", "max-slice-nums")
SKIPPED_AT_REGISTER_032 = {
    "reasoning-parser": r"vLLM has a 'minicpmv' reasoning parser",
    "rotary-mrope": r"platform cpu is not Ascend",
    "uvicorn-signals": r"vLLM's [\w/.]+ runs a uvicorn server without uvicorn's signal handlers \(vLLM #50916\)",
    "allowed-token-ids-rows": (r"vLLM's InputBatch\.condense clears the row it moves a request from, and swap_states "
                               r"swaps `allowed_token_ids_mask_cpu_tensor` rows by copy"),
}
if not CPU_RUNS_THE_CONV_KERNEL:
    SKIPPED_AT_REGISTER_032["gdn-one-token-prefill"] = re.escape(gdn_one_token_prefill.NO_KERNEL_HERE)
MODEL_IMPORT_ORDER = tuple(p.name for p in PATCHES if p.stage == AT_MODEL_IMPORT)
# Decided at the model import too, and applied on vLLM 0.32 (vit-varlen-attention: its Idefics2
# encoder still pads and masks).
MODEL_PATCHES_032 = tuple(name for name in MODEL_IMPORT_ORDER if name not in BACKPORTS)
APPLIED_AT_REGISTER_032 = tuple(p.name for p in PATCHES
                                if p.stage != AT_MODEL_IMPORT and p.name not in SKIPPED_AT_REGISTER_032)
LOG_LINE = re.compile(r"^\((?P<process>[\w-]+) pid=(?P<pid>\d+)\) INFO .*? (?P<message>minicpmv_ascend_plugin.*)$")
REGISTER = re.compile(
    r"^minicpmv_ascend_plugin \d+\.\d+\.\d+ \(vLLM 0\.32\.\d+, transformers [\d.]+, platform cpu\): "
    r"applied: " + ", ".join(APPLIED_AT_REGISTER_032)
    + r"; skipped: " + ", ".join(rf"{p.name} \({SKIPPED_AT_REGISTER_032[p.name]}\)" for p in PATCHES
                                 if p.name in SKIPPED_AT_REGISTER_032)
    + r"; decided when vLLM imports minicpmv4_6: " + ", ".join(MODEL_IMPORT_ORDER) + "$")
MODEL_IMPORT = re.compile(
    r"^minicpmv_ascend_plugin: minicpmv4_6 imported \(vLLM 0\.32\.\d+\): applied: "
    + ", ".join(MODEL_PATCHES_032) + "; skipped: "
    + ", ".join(rf"{name} \([^;]+\)" for name in BACKPORTS) + "$")


@pytest.mark.server
def test_plugin_loads_in_every_vllm_process_and_applies_no_backport(server):
    lines = [m.groupdict() for line in server.log_path.read_text(errors="replace").splitlines()
             if (m := LOG_LINE.match(line))]
    processes: dict[str, set[str]] = {}  # pid -> vLLM's names for it
    registered: dict[str, list[str]] = {}
    model_imports: dict[str, list[str]] = {}
    for line in lines:
        processes.setdefault(line["pid"], set()).add(line["process"])
        if line["message"].startswith("minicpmv_ascend_plugin: minicpmv4_6 imported"):
            model_imports.setdefault(line["pid"], []).append(line["message"])
        elif REGISTER.match(line["message"]):
            registered.setdefault(line["pid"], []).append(line["message"])
        else:
            pytest.fail(f"unexpected plugin line: {line}")
    names = {name for pid in registered for name in processes[pid]}
    assert {"APIServer", "EngineCore"} <= names, (names, lines)
    assert all(len(v) == 1 for v in registered.values()), registered  # once per process
    assert set(model_imports) <= set(registered)
    for messages in model_imports.values():
        assert len(messages) == 1 and MODEL_IMPORT.match(messages[0]), messages
    # Every process that loaded vLLM's MiniCPM-V module (API server for the processor, engine
    # core / worker for the model) decided the backports: none applies on vLLM 0.32.
    assert {name for pid in model_imports for name in processes[pid]} & {"APIServer"}
    assert {name for pid in model_imports for name in processes[pid]} & {"EngineCore", "Worker", "VllmWorker-0"}


ROTARY_RUN = textwrap.dedent('''
    """Greedy text + image generations with prompt logprobs: plain RoPE, then the plugin's Ascend
    M-RoPE config (installed by the plugin's own hook, as register() does on Ascend A2/A3)."""
    import gc, json, sys
    import numpy as np
    from PIL import Image
    from vllm import LLM, SamplingParams
    from rotary_probe import rotary_types  # importable by vLLM's worker process (PYTHONPATH)

    PROMPT = "<|im_start|>user\\n{}<|im_end|>\\n<|im_start|>assistant\\n<think>\\n"

    def run(checkpoint, prompts, **engine):
        llm = LLM(model=checkpoint, dtype="bfloat16", max_model_len=4096, enforce_eager=True, seed=0,
                  limit_mm_per_prompt={"image": 1}, **engine,
                  # vLLM's native (PyTorch) rotary ops on both sides: the C++ kernel that plain
                  # RoPE would use on a CPU rounds differently from the M-RoPE path's ops.
                  compilation_config={"custom_ops": ["all", "-rotary_embedding"]})
        config = llm.llm_engine.model_config
        info = {"uses_mrope": config.uses_mrope, "rope": dict(config.hf_text_config.rope_parameters),
                "ssm_dtype": llm.llm_engine.vllm_config.cache_config.mamba_ssm_cache_dtype,
                "rotary": llm.apply_model(rotary_types)[0]}
        params = SamplingParams(temperature=0, max_tokens=12, logprobs=5, prompt_logprobs=5, seed=0)
        outputs = []
        for out in llm.generate(prompts, params, use_tqdm=False):
            gen = out.outputs[0]
            outputs.append({
                "prompt_token_ids": list(out.prompt_token_ids), "tokens": list(gen.token_ids),
                "logprobs": [{str(k): v.logprob for k, v in d.items()} for d in gen.logprobs],
                "prompt_logprobs": [None if d is None else {str(k): v.logprob for k, v in d.items()}
                                    for d in out.prompt_logprobs]})
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        return {"info": info, "outputs": outputs}

    if __name__ == "__main__":
        image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (300, 420, 3), dtype=np.uint8))
        prompts = [PROMPT.format("Please calculate 23 x 47 step by step."),
                   {"prompt": PROMPT.format("<|image_pad|>Describe this image in one sentence."),
                    "multi_modal_data": {"image": image}}]
        plain = run(sys.argv[1], prompts)  # --mamba-ssm-cache-dtype left at auto: the plugin's hook
        from minicpmv_ascend_plugin.patches.model import rotary_mrope
        rotary_mrope.apply(None)
        mrope = run(sys.argv[1], prompts, mamba_ssm_cache_dtype="float32")
        print("RESULT " + json.dumps({"plain": plain, "mrope": mrope}))
''')


@pytest.mark.engine(engines=2)  # two offline LLMs in one script (in its process): plain and M-RoPE
def test_ascend_rotary_config_is_an_exact_noop(tiny_checkpoint, tmp_path):
    """The M-RoPE section the plugin gives the text config on Ascend (derived from the config: the
    tiny model's head_dim 64 x 0.25 = 16 rotary dims = 8 pairs -> [3, 3, 2]) changes the rotary
    class and the position layout, and not one bit of the tokens, logprobs or prompt logprobs.
    (The first run also leaves --mamba-ssm-cache-dtype at auto: the plugin's GDN hook makes it the
    checkpoint's float32, as the second run's explicit flag does.)"""
    script = tmp_path / "rotary_run.py"
    script.write_text(ROTARY_RUN)
    (tmp_path / "rotary_probe.py").write_text(
        "def rotary_types(model):\n"
        "    names = {type(m).__name__ for m in model.modules()}\n"
        "    return sorted(n for n in names if n.endswith('RotaryEmbedding'))\n")
    # The engine in the script's own process (no EngineCore and worker processes, each importing
    # vLLM again: 4 imports fewer for the two runs); both runs alike, so the comparison stands.
    env = clean_env(VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", VLLM_ALLOW_INSECURE_SERIALIZATION="1",
                    VLLM_ENABLE_V1_MULTIPROCESSING="0",
                    PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(script), str(tiny_checkpoint)], capture_output=True, text=True,
                          timeout=900, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT ")).removeprefix("RESULT "))
    plain, mrope = result["plain"], result["mrope"]
    assert plain["info"]["ssm_dtype"] == mrope["info"]["ssm_dtype"] == "float32"  # auto -> checkpoint's
    assert not plain["info"]["uses_mrope"] and plain["info"]["rotary"] == ["RotaryEmbedding"]
    assert mrope["info"]["uses_mrope"] and mrope["info"]["rotary"] == ["MRotaryEmbedding"]
    assert mrope["info"]["rope"] == {**plain["info"]["rope"], "mrope_section": [3, 3, 2], "mrope_interleaved": True}
    from transformers import AutoTokenizer

    image_pad = AutoTokenizer.from_pretrained(tiny_checkpoint).convert_tokens_to_ids("<|image_pad|>")
    text, image = plain["outputs"]
    assert image_pad not in text["prompt_token_ids"] and image["prompt_token_ids"].count(image_pad) > 16
    assert len(text["tokens"]) > 0 and len(image["prompt_logprobs"]) == len(image["prompt_token_ids"])
    assert mrope["outputs"] == plain["outputs"]  # bitwise: every float compared exactly


def test_reasoning_cases_are_vllm_032_minicpmv(tiny_config):
    """plugin/tests/reasoning_cases.json holds vLLM 0.32's own `minicpmv` results; the plugin's
    `minicpmv` for vLLM 0.23 is held to the same table there."""
    from transformers import AutoTokenizer
    from vllm.reasoning import ReasoningParserManager

    parser = ReasoningParserManager.get_reasoning_parser("minicpmv")
    tokenizer = AutoTokenizer.from_pretrained(tiny_config)
    assert reasoning_harness.results(parser, tokenizer) == reasoning_harness.load_cases()


# ------------------------------------------------------------------ gdn-one-token-prefill

ONE_TOKEN = [100]  # any id; a one-token text prompt ("a") takes the same path
ENGINE_DEATH_EXIT_BOUND_S = 120


def post_json(base_url: str, path: str, body: dict, timeout: float = 120) -> tuple[int, dict]:
    status, answer = raw_http.send(base_url + path, body, method="POST", timeout=timeout)
    return status, json.loads(answer or b"{}")


def test_one_token_conv_kernel_probe_and_fix():
    """vLLM-CPU's conv kernel refuses a one-token prefill laid out as vLLM lays it out (the bug);
    the plugin's wrapper gives it the same values in the layout it checks for, and the output
    and conv state are bitwise what the kernel computes for that token as the first of two."""
    import torch
    import vllm._custom_ops as ops

    from minicpmv_ascend_plugin.patches.model import gdn_one_token_prefill as patch

    if not CPU_RUNS_THE_CONV_KERNEL:
        pytest.skip("vLLM-CPU runs its torch conv (not the C++ kernel) without AVX-512 BF16")
    error = patch.probe()
    assert isinstance(error, RuntimeError) and "expect x to be transposed" in str(error), error
    assert patch.check(None) is None
    original = getattr(ops.causal_conv1d_fwd_cpu, "_minicpmv_ascend_plugin_wraps", ops.causal_conv1d_fwd_cpu)
    fixed = patch._causal_conv1d_fwd_cpu(original)

    one = patch.probe_input()
    out_one = fixed(**one)
    two = dict(one, conv_states=torch.zeros_like(one["conv_states"].transpose(1, 2)).transpose(1, 2),
               query_start_loc=torch.tensor([0, 2], dtype=torch.int32))
    tokens = torch.cat([one["x"].transpose(0, 1), torch.randn(1, one["x"].size(0), dtype=torch.bfloat16)])
    two["x"] = tokens.contiguous().transpose(0, 1)  # what vLLM passes for a 2-token prefill
    out_two = original(**two)
    assert torch.equal(out_one[:, 0], out_two[:, 0])  # causal: token 0 does not see token 1
    state_one, state_two = one["conv_states"][0], two["conv_states"][0]  # [dim, width - 1]
    assert torch.equal(state_one[:, 2], one["x"][:, 0]) and not state_one[:, :2].any()
    assert torch.equal(state_two[:, 1:], two["x"]) and not state_two[:, 0].any()
    assert patch.fits(two["x"])  # a multi-token x has the kernel's layout: the wrapper passes it on


@pytest.mark.server
def test_one_token_prompt_logprobs_equal_the_longer_prompts(server):
    """Numerics of the fixed path: the first generated token's logprobs after a one-token prompt
    (the re-laid-out one-token prefill) equal the prompt logprobs at position 1 of a longer prompt
    starting with that token (an ordinary multi-token prefill: causal, so position 0 sees only
    that token). Both are bf16 on the same server: equal up to GEMM-shape rounding (measured:
    bitwise equal)."""
    status, tokenized = post_json(server.base_url, "/tokenize", {"model": server.model, "prompt": "a"})
    assert status == 200 and tokenized["count"] == 1, tokenized
    for token in (ONE_TOKEN[0], tokenized["tokens"][0]):
        status, one = post_json(server.base_url, "/v1/completions", {
            "model": server.model, "prompt": [token], "max_tokens": 1, "logprobs": 5, "temperature": 0,
            "return_tokens_as_token_ids": True})
        assert status == 200, one
        status, longer = post_json(server.base_url, "/v1/completions", {
            "model": server.model, "prompt": [token, 7, 8, 9], "max_tokens": 1, "prompt_logprobs": 5,
            "temperature": 0, "return_tokens_as_token_ids": True})
        assert status == 200, longer
        first = one["choices"][0]["logprobs"]["top_logprobs"][0]
        at_1 = {f"token_id:{k}": v["logprob"] for k, v in longer["choices"][0]["prompt_logprobs"][1].items()
                if v["rank"] <= 5}
        diff = max(abs(first[k] - at_1[k]) for k in first) if set(first) == set(at_1) else None
        print(f"\nprompt [{token}]: top-5 {first}; max |logprob diff| vs prompt logprobs: {diff}")
        assert set(first) == set(at_1), (first, at_1)
        assert diff <= 1e-3, (first, at_1)
    # A chat prompt is never one token: the template wraps even an empty message (and, like
    # Qwen3.5's, refuses a conversation without a user message).
    status, chat = post_json(server.base_url, "/tokenize", {
        "model": server.model, "messages": [{"role": "user", "content": ""}], "add_generation_prompt": False})
    assert status == 200 and chat["count"] > 1, chat
    assert http_get(f"{server.base_url}/health")[0] == 200


@pytest.mark.engine(engines=1)
@pytest.mark.skipif(not CPU_RUNS_THE_CONV_KERNEL, reason="this CPU has no AVX-512 BF16: vLLM-CPU does not run "
                    "the conv kernel that has the bug (test_patch_table_cpu_column_is_this_vllms_decisions "
                    "checks the plugin decides so)")
def test_one_token_prompt_kills_the_engine_without_the_plugin(tiny_checkpoint, tmp_path):
    """The bug, on the real server with MINICPMV_ASCEND_PLUGIN=off: a one-token prompt gets 500,
    the worker raised vLLM-CPU's layout error, and the server stops by itself (the fixed path is
    `test_one_token_prompt_logprobs_equal_the_longer_prompts` and the one-token rows of
    tests/test_bad_requests.py, on the shared server)."""
    srv = start_server(tiny_checkpoint, tmp_path / "server.log", MINICPMV_ASCEND_PLUGIN="off")
    try:
        srv.wait_ready()
        status, body = post_json(srv.base_url, "/v1/completions", {
            "model": srv.model, "prompt": [100, 101], "max_tokens": 2})
        assert status == 200, body  # two tokens are fine
        started = time.monotonic()
        status, body = post_json(srv.base_url, "/v1/completions", {
            "model": srv.model, "prompt": ONE_TOKEN, "max_tokens": 4})
        assert status == 500 and "EngineCore encountered an issue" in body["error"]["message"], body
        try:
            code = srv.process.wait(ENGINE_DEATH_EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"server still running {ENGINE_DEATH_EXIT_BOUND_S} s after its engine died")
        print(f"\none-token prompt without the plugin: 500, server exit {code} "
              f"{time.monotonic() - started:.1f} s later")
        log = srv.log_path.read_text(errors="replace")
        assert "RuntimeError: causal_conv1d_fwd_cpu: expect x to be transposed." in log
    finally:
        srv.stop()


CHECK_LINE = re.compile(r"^(platform|plugin|patch [\w-]+|request (text|image|one-token)|result): .+$")


def run_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "ascend_check.py"), *args], capture_output=True,
                          text=True, timeout=300, env=clean_env(HF_HUB_OFFLINE="1"), cwd=REPO)


@pytest.mark.server
def test_ascend_check_script_against_the_server(server):
    proc = run_check("--base-url", server.base_url, "--model", server.model)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert all(CHECK_LINE.match(line) for line in lines), lines
    assert re.match(r"^platform: cpu \(-\), vLLM 0\.32\.\d+, vllm-ascend -, transformers [\d.]+, "
                    r"torch [\w.+]+$", lines[0]), lines[0]
    assert re.match(r"^plugin: minicpmv_ascend_plugin \d+\.\d+\.\d+$", lines[1])
    count = len(PATCHES)
    patches = dict(re.match(r"^patch ([\w-]+): (applied|skipped) - .+$", line).groups()
                   for line in lines[2:2 + count])
    assert patches == {**{name: "skipped" for name in BACKPORTS + tuple(SKIPPED_AT_REGISTER_032)},
                       **{name: "applied" for name in APPLIED_AT_REGISTER_032 + MODEL_PATCHES_032}}
    assert len(patches) == len(PATCHES) == count
    assert "patch rotary-mrope: skipped - platform cpu is not Ascend" in lines
    for name, line in zip(("text", "image", "one-token"), lines[2 + count:5 + count]):
        assert re.match(rf"^request {name}: ok - \d+ prompt \+ \d+ completion tokens in [\d.]+ s, ", line), line
    assert lines[4 + count].startswith("request one-token: ok - 1 prompt + ") and lines[4 + count].endswith(
        "/health 200 after it"), lines[4 + count]
    assert lines[5 + count:] == ["result: ok"]


@pytest.mark.slow
def test_ascend_check_script_reports_an_unreachable_server():
    proc = run_check("--base-url", "http://127.0.0.1:9", "--timeout", "5")
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[-4].startswith("request text: FAILED - cannot list models at http://127.0.0.1:9")
    assert lines[-3].startswith("request image: FAILED") and lines[-2].startswith("request one-token: FAILED")
    assert lines[-1] == "result: FAILED"
