"""The plugin loaded the way vLLM 0.23 loads it, its config hooks in vLLM 0.23's VllmConfig, its
reasoning parser against vLLM 0.23's `qwen3`, and the pure decision functions."""

from __future__ import annotations

import json
import textwrap

import pytest

import reasoning_harness
from _vllm023 import run_python

SERVER_PATCHES = ["engine-death-exit", "shutdown-cut-requests", "file-url-400", "image-bomb-400", "uvicorn-signals",
                  "shutdown-drain-503", "request-type-400", "content-part-400", "responses-assistant-content",
                  "public-media-urls"]
CPU_ONLY = "gdn-one-token-prefill"  # between file-url-400 and image-bomb-400 in PATCHES
# json-whitespace applies where vLLM runs grammars (the image has xgrammar); this venv holds vLLM's
# Python code without xgrammar, so its predicate skips it here. Last in PATCHES.
XGRAMMAR_PATCH = "json-whitespace"

PROBE = textwrap.dedent("""
    import json, sys, time
    import vllm.engine.arg_utils  # what vLLM 0.23's API server has imported when it loads plugins
    from vllm.plugins import load_general_plugins
    before = set(sys.modules)
    started = time.monotonic()
    load_general_plugins()
    register_seconds = time.monotonic() - started
    import minicpmv_ascend_plugin as plugin
    new_vllm_modules = sorted(m for m in set(sys.modules) - before if m.startswith("vllm."))
    model_imported_by_register = "vllm.model_executor.models" in sys.modules
    pending = {k: v.status for k, v in plugin.decisions().items()}
    import vllm.model_executor.models.minicpmv4_6 as m
    print("AGAIN", flush=True)
    plugin._registered = False
    plugin.register()  # again: nothing may be applied twice
    wrapped, f = 0, m.MiniCPMV4_6ProcessingInfo._compute_visual_tokens
    while hasattr(f, "__wrapped__"):
        wrapped, f = wrapped + 1, f.__wrapped__
    from vllm.reasoning import ReasoningParserManager
    print("RESULT " + json.dumps({
        "register_seconds": register_seconds, "model_imported_by_register": model_imported_by_register,
        "new_vllm_modules": new_vllm_modules,
        "pending": pending, "decisions": {k: [v.status, v.reason] for k, v in plugin.decisions().items()},
        "wrapped": wrapped, "minicpmv_parser": "minicpmv" in ReasoningParserManager.list_registered()}))
""")


def result(proc) -> dict:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def test_loaded_by_vllm_applies_every_backport_once():
    proc = run_python(PROBE)
    out = result(proc)
    log = proc.stdout.split("AGAIN")[0]  # vLLM 0.23 logs to stdout
    backports = ["processor-version", "image-size-order", "vit-merger-flags", "max-slice-nums"]
    assert out["register_seconds"] < 1, out  # cheap: no vLLM model code imported
    assert not out["model_imported_by_register"], out
    assert [m for m in out["new_vllm_modules"] if m.startswith(("vllm.model_executor", "vllm.v1"))] == [], out
    assert all(out["pending"][name] == "pending" for name in backports)
    assert {k: v[0] for k, v in out["decisions"].items()} == {
        "reasoning-parser": "applied", "gdn-state-dtype": "applied", "rotary-mrope": "skipped",
        **{name: "applied" for name in backports + SERVER_PATCHES}, CPU_ONLY: "skipped", XGRAMMAR_PATCH: "skipped"}
    assert out["decisions"][XGRAMMAR_PATCH][1] == "xgrammar is not installed"
    assert "not Ascend" in out["decisions"]["rotary-mrope"][1]
    assert out["decisions"][CPU_ONLY][1] == \
        "platform unspecified does not run vLLM-CPU's GDN conv kernel"
    assert out["wrapped"] == 1 and out["minicpmv_parser"]
    lines = [l for l in log.splitlines() if "minicpmv_ascend_plugin" in l]
    assert len(lines) == 2, lines  # one at registration, one when the model module is imported
    assert "(vLLM 0.23.0, transformers 5.14.1, platform unspecified): applied: reasoning-parser, " \
           f"gdn-state-dtype, {', '.join(SERVER_PATCHES)}; " \
           "skipped: rotary-mrope (platform unspecified is not Ascend), gdn-one-token-prefill (platform " \
           "unspecified does not run vLLM-CPU's GDN conv kernel), json-whitespace (xgrammar is not " \
           "installed)" in lines[0]
    assert "applied: processor-version, image-size-order, vit-merger-flags, max-slice-nums; skipped: none" in lines[1]


CONFIG = textwrap.dedent("""
    import json, sys
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, VllmConfig
    def build(ssm="auto"):
        model = ModelConfig(model=sys.argv[1], tokenizer=sys.argv[1], dtype="bfloat16", max_model_len=4096)
        config = VllmConfig(model_config=model, cache_config=CacheConfig(mamba_ssm_cache_dtype=ssm),
                            device_config=DeviceConfig(device="cpu"))
        return {"ssm": config.cache_config.mamba_ssm_cache_dtype, "uses_mrope": model.uses_mrope,
                "rope": dict(model.hf_text_config.rope_parameters)}
    out = {"without_plugin": build()}
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    out["with_plugin"], out["explicit_bf16"] = build(), build("bfloat16")
    print("RESULT " + json.dumps(out))
""")


def test_config_hooks_in_vllm023_vllmconfig(checkpoint):
    out = result(run_python(CONFIG.replace("sys.argv[1]", repr(str(checkpoint)))))
    assert out["without_plugin"]["ssm"] == "auto"  # the bug: the GDN state follows the bf16 model
    assert out["with_plugin"]["ssm"] == "float32"  # the checkpoint's text_config.mamba_ssm_dtype
    assert out["explicit_bf16"]["ssm"] == "bfloat16"  # an explicit flag is never overridden
    assert "mrope_section" not in out["with_plugin"]["rope"] and not out["with_plugin"]["uses_mrope"]


def test_rotary_config_hook_when_it_applies(checkpoint):
    """What the Ascend fix does to the config (forced here: this is no Ascend): the TEXT config
    gets the section derived from its rotary dims, and vLLM switches to M-RoPE positions."""
    code = CONFIG.replace("sys.argv[1]", repr(str(checkpoint)))
    out = result(run_python(code, env={"MINICPMV_ASCEND_PLUGIN_FORCE": "rotary-mrope"}))
    rope = out["with_plugin"]["rope"]
    assert rope["mrope_section"] == [3, 3, 2] and rope["mrope_interleaved"] is True  # 64 * 0.25 / 2 = 8
    assert rope["partial_rotary_factor"] == 0.25 and rope["rope_type"] == "default"
    assert out["with_plugin"]["uses_mrope"] and not out["without_plugin"]["uses_mrope"]


def test_reasoning_parsers_match_vllm032_minicpmv(checkpoint):
    """0.23's `qwen3` already handles output that starts inside <think> (thinking on); the
    registered `minicpmv` matches vLLM 0.32's `minicpmv` on every case, thinking on and off."""
    from transformers import AutoTokenizer
    from vllm.reasoning import ReasoningParserManager

    from minicpmv_ascend_plugin import reasoning

    assert "minicpmv" not in ReasoningParserManager.list_registered()
    assert reasoning.check(None) is None
    reasoning.apply(None)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    expected = reasoning_harness.load_cases()
    assert reasoning_harness.results(ReasoningParserManager.get_reasoning_parser("minicpmv"), tokenizer) == expected
    qwen3 = reasoning_harness.results(ReasoningParserManager.get_reasoning_parser("qwen3"), tokenizer)
    for got, want in zip(qwen3, expected):
        if want["thinking"] and want["reasoning"] is not None:
            assert got == want  # thinking on: the Thinking template's output is split correctly
    differs = [w["output"] for g, w in zip(qwen3, expected) if g != w]
    assert differs == ["</think>\n\nno reasoning at all", "The answer is 5.", "Line one.\nLine two.",
                       "<think>\nstray</think>\n\nvisible"]


@pytest.mark.parametrize(("transformers", "has_model", "vllm", "ok"), [
    ("5.14.1", True, "0.23.0+empty", True),
    ("5.7.0", True, "0.23.0", True),
    ("5.20.2", True, "0.33.0", True),
    ("5.5.4", False, "0.23.0+empty", False),  # the vllm-ascend 0.23.0 image's pin: no minicpmv4_6
    ("5.21.0", True, "0.23.0", False),  # new find_best_resize() signature
    ("5.21.0", True, "0.33.1", False),
    ("5.21.0", True, "0.34.0", True),  # unknown future vLLM: not blocked
    (None, False, "0.23.0", False),
])
def test_transformers_requirement(transformers, has_model, vllm, ok):
    from minicpmv_ascend_plugin.transformers_check import problem

    message = problem(transformers, has_model, vllm)
    assert (message is None) == ok, message
    if message:
        assert "transformers==5.14.1" in message


def test_transformers_requirement_fails_vllm_start():
    """An unusable transformers stops vLLM's plugin loading with the plugin's message."""
    code = ("import minicpmv_ascend_plugin.transformers_check as t\n"
            "t.current_problem = lambda v: 'transformers 5.5.4 has no MiniCPM-V 4.6: install transformers==5.14.1'\n"
            "from vllm.plugins import load_general_plugins\nload_general_plugins()\n")
    proc = run_python(code)
    assert proc.returncode != 0
    assert "RuntimeError: minicpmv_ascend_plugin: transformers 5.5.4 has no MiniCPM-V 4.6" in proc.stderr


def test_version_tuples_and_sections():
    from types import SimpleNamespace

    from minicpmv_ascend_plugin import rotary_mrope
    from minicpmv_ascend_plugin._base import release

    assert release("0.23.0+empty") == (0, 23, 0) and release("v0.25.1rc1") == (0, 25, 1)
    assert release("0.23.0+empty") < (0, 24) and release("0.32.0+cpu") >= (0, 32)
    released = SimpleNamespace(head_dim=256, hidden_size=1024, num_attention_heads=8, rope_parameters={
        "rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25})
    assert rotary_mrope.overrides(released) == {
        "text_config": {"rope_parameters": {"mrope_section": [11, 11, 10], "mrope_interleaved": True}}}
    assert [rotary_mrope.section_for(p) for p in (3, 4, 8, 32, 64)] == [
        [1, 1, 1], [2, 1, 1], [3, 3, 2], [11, 11, 10], [22, 22, 20]]
    already = SimpleNamespace(**{**vars(released), "rope_parameters": {"mrope_section": [1, 1, 1]}})
    assert rotary_mrope.overrides(already) is None


def test_ascend_check_script_on_vllm023():
    """The NPU users' check script on vLLM 0.23.0 (no server here: --no-requests)."""
    import subprocess
    import sys

    from _vllm023 import REPO

    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "ascend_check.py"), "--no-requests"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("platform: unspecified (-), vLLM 0.23.0, vllm-ascend -, transformers 5.14.1, ")
    assert [line.split(" - ")[0] for line in lines[2:]] == [
        "patch reasoning-parser: applied", "patch gdn-state-dtype: applied", "patch rotary-mrope: skipped",
        "patch processor-version: applied", "patch image-size-order: applied", "patch vit-merger-flags: applied",
        "patch max-slice-nums: applied", *[f"patch {name}: applied" for name in SERVER_PATCHES[:3]],
        f"patch {CPU_ONLY}: skipped", *[f"patch {name}: applied" for name in SERVER_PATCHES[3:]],
        f"patch {XGRAMMAR_PATCH}: skipped", "result: ok"]


@pytest.mark.parametrize("plugin_env, expected", [
    ({}, "minicpmv"), ({"MINICPMV_ASCEND_PLUGIN": "off"}, "qwen3"), ({"MINICPMV_ASCEND_PLUGIN": "0"}, "qwen3"),
])
def test_launcher_auto_reasoning_parser_on_vllm023(plugin_env, expected):
    """vLLM 0.23 has no `minicpmv` parser; the plugin registers one, so the launcher's `auto` picks
    it (and vLLM's registry, after loading plugins, really has it); with the plugin off, `qwen3`."""
    code = textwrap.dedent("""
        from minicpmv_ascend import settings
        from vllm.plugins import load_general_plugins
        from vllm.reasoning import ReasoningParserManager
        load_general_plugins()
        print(settings.auto_reasoning_parser(), "minicpmv" in ReasoningParserManager.list_registered())
    """)
    proc = run_python(code, env=plugin_env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    chosen, registered = proc.stdout.split()[-2:]
    assert chosen == expected
    assert registered == str(expected == "minicpmv")
