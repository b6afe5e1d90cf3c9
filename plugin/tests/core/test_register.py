"""The plugin loaded the way the target's vLLM loads it (every predicate deciding what that vLLM
needs, and the patch table's column for it), its config hooks in that vLLM's VllmConfig, its
reasoning parser against that vLLM's `qwen3`, and the pure decision functions."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

import reasoning_harness
from _target import REPO, run_python

PROBE = textwrap.dedent("""
    import json, sys, time
    import vllm.engine.arg_utils  # what vLLM's API server has imported when it loads plugins
    from vllm.plugins import load_general_plugins
    before = set(sys.modules)
    started = time.monotonic()
    load_general_plugins()
    register_seconds = time.monotonic() - started
    import minicpmv_ascend_plugin as plugin
    from minicpmv_ascend_plugin.core import registry
    new_vllm_modules = sorted(m for m in set(sys.modules) - before if m.startswith("vllm."))
    model_imported_by_register = "vllm.model_executor.models" in sys.modules
    pending = {k: v.status for k, v in plugin.decisions().items()}
    import vllm.model_executor.models.minicpmv4_6 as m
    print("AGAIN", flush=True)
    registry._registered = False
    plugin.register()  # again: nothing may be applied twice
    wrapped, f = 0, m.MiniCPMV4_6ProcessingInfo._compute_visual_tokens
    while hasattr(f, "__wrapped__"):
        wrapped, f = wrapped + 1, f.__wrapped__
    from vllm.reasoning import ReasoningParserManager
    from minicpmv_ascend import settings
    auto_parser = settings.auto_reasoning_parser()  # the launcher's `auto`, as the API server loads it
    ReasoningParserManager.get_reasoning_parser(auto_parser)
    print("RESULT " + json.dumps({
        "auto_reasoning_parser": auto_parser,
        "register_seconds": register_seconds, "model_imported_by_register": model_imported_by_register,
        "new_vllm_modules": new_vllm_modules,
        "pending": pending, "decisions": {k: [v.status, v.reason] for k, v in plugin.decisions().items()},
        "wrapped": wrapped, "minicpmv_parser": "minicpmv" in ReasoningParserManager.list_registered()}))
""")


def result(proc) -> dict:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


@pytest.fixture(scope="module")
def loaded():
    """The plugin loaded by vLLM in a process of its own, forked where vLLM's API server loads plugins
    (_target.ZYGOTE_PRELOAD): (RESULT, log up to the second registration)."""
    proc = run_python(PROBE)
    return result(proc), proc.stdout.split("AGAIN")[0] + proc.stderr.split("AGAIN")[0]


def test_loaded_by_vllm_decides_what_this_vllm_needs(loaded, target):
    import minicpmv_ascend_plugin as plugin
    from minicpmv_ascend_plugin.core.patch import AT_MODEL_IMPORT

    out, log = loaded
    backports = [p.name for p in plugin.PATCHES if p.stage == AT_MODEL_IMPORT]
    assert out["register_seconds"] < 1, out  # cheap: no vLLM model code imported
    assert not out["model_imported_by_register"], out
    assert [m for m in out["new_vllm_modules"] if m.startswith(("vllm.model_executor", "vllm.v1"))] == [], out
    assert all(out["pending"][name] == "pending" for name in backports)
    # Every predicate, reading this vLLM's own code, says what the tests show it needs (a patch
    # that applies where it is not needed is a bug too), and none of them failed to read it.
    decisions = {k: v[0] for k, v in out["decisions"].items()}
    assert decisions == {p.name: "applied" if target.needs(p.name) else "skipped" for p in plugin.PATCHES}, \
        out["decisions"]
    assert not [v for v in out["decisions"].values() if "predicate failed" in v[1]], out["decisions"]
    assert "not Ascend" in out["decisions"]["rotary-mrope"][1]
    assert out["wrapped"] == int(target.needs("image-size-order")) and out["minicpmv_parser"]
    lines = [l for l in log.splitlines() if "minicpmv_ascend_plugin" in l]
    assert len(lines) == 2, lines  # one at registration, one when the model module is imported
    at_register = [p.name for p in plugin.PATCHES if p.stage != AT_MODEL_IMPORT]
    applied = [n for n in at_register if decisions[n] == "applied"]
    skipped = [f"{n} ({out['decisions'][n][1]})" for n in at_register if decisions[n] == "skipped"]
    assert (f"(vLLM {target.vllm}, transformers {target.transformers_pin}, platform unspecified): "
            f"applied: {', '.join(applied)}; skipped: {', '.join(skipped)}") in lines[0]
    applied = [n for n in backports if decisions[n] == "applied"]
    skipped = [f"{n} ({out['decisions'][n][1]})" for n in backports if decisions[n] == "skipped"]
    assert f"applied: {', '.join(applied) or 'none'}; skipped: {', '.join(skipped) or 'none'}" in lines[1]


def test_no_predicate_misses_its_layout(loaded, target):
    """Every patch's predicate finds, in this target's vLLM, the code it reads to decide: none says
    "layout not found" (the state in which a server only warns; see plugin/README.md)."""
    import minicpmv_ascend_plugin as plugin

    out, log = loaded
    assert set(out["decisions"]) == {p.name for p in plugin.PATCHES}
    unfound = {k: v[1] for k, v in out["decisions"].items() if v[0] == plugin.LAYOUT_NOT_FOUND}
    assert not unfound, f"vLLM {target.vllm}: layout not found: {unfound}"
    assert "layout not found" not in log


def test_patch_table_column_is_this_vllms_decisions(loaded, target):
    """The generated table in plugin/README.md says, in this target's
    column, what this vLLM's predicates decide (`make patch-table` regenerates it)."""
    import minicpmv_ascend_plugin as plugin
    import patch_table  # scripts/ (pyproject.toml's pytest pythonpath)

    out, _ = loaded
    decided = {"vllm": target.vllm, "patches": [
        {"name": p.name, "status": out["decisions"][p.name][0], "reason": out["decisions"][p.name][1]}
        for p in plugin.PATCHES]}
    title, cells = patch_table.column_title(decided), patch_table.column(decided)
    for path in patch_table.files():
        table = patch_table.parse(path.read_text(encoding="utf-8"))
        assert table.get(title) == cells, f"{path.name} is out of date: run `make patch-table`"


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


def test_config_hooks_in_vllmconfig(checkpoint, target):
    out = result(run_python(CONFIG.replace("sys.argv[1]", repr(str(checkpoint)))))
    # Without the plugin: the bug (the GDN state follows the bf16 model), or this vLLM's own hook.
    assert out["without_plugin"]["ssm"] == ("auto" if target.needs("gdn-state-dtype") else "float32")
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


# The cases (reasoning_cases.json: vLLM 0.32's own `minicpmv`) where each target's `qwen3` differs.
QWEN3_DIFFERS = {
    # string-level parser: "" for no reasoning, and thinking off is not content-only
    "0.23.0": ["</think>\n\nno reasoning at all", "The answer is 5.", "Line one.\nLine two.",
               "<think>\nstray</think>\n\nvisible"],
    # parser engine (vllm/parser/qwen3.py, as 0.32's): only the stray <think> block with thinking off
    "0.30.0": ["<think>\nstray</think>\n\nvisible"],
}


def test_reasoning_parsers_match_vllm032_minicpmv(checkpoint, target, minicpmv_parser):
    """The target's `qwen3` already handles output that starts inside <think> (thinking on); the
    `minicpmv` the plugin registers where vLLM has none (or vLLM's own) matches vLLM 0.32's
    `minicpmv` on every case, thinking on and off, streaming and not."""
    from transformers import AutoTokenizer
    from vllm.reasoning import ReasoningParserManager

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    expected = reasoning_harness.load_cases()
    assert reasoning_harness.results(ReasoningParserManager.get_reasoning_parser("minicpmv"), tokenizer) == expected
    qwen3 = reasoning_harness.results(ReasoningParserManager.get_reasoning_parser("qwen3"), tokenizer)
    for got, want in zip(qwen3, expected):
        if want["thinking"] and want["reasoning"] is not None:
            assert got == want  # thinking on: the Thinking template's output is split correctly
    assert [w["output"] for g, w in zip(qwen3, expected) if g != w] == QWEN3_DIFFERS[target.vllm]
    # Through the parser object vLLM's chat server builds from `--reasoning-parser minicpmv`, with
    # the prompt ids: 0.32's server results, except where this target's serving path differs.
    server = reasoning_harness.server_results("minicpmv", tokenizer)
    server_expected = reasoning_harness.load_cases(reasoning_harness.SERVER_CASES)
    assert [w["output"] for g, w in zip(server, server_expected) if g != w] == SERVER_DIFFERS[target.vllm]


# Where the server path of `minicpmv` differs from vLLM 0.32's (reasoning_server_cases.json).
SERVER_DIFFERS = {
    # 0.23's streaming keeps parsing after the prompt's `</think>` and drops a stray block, as its
    # non-streaming does; 0.32 (and 0.30) stream that block as content.
    "0.23.0": ["<think>\nstray</think>\n\nvisible"],
    "0.30.0": [],
}


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
def test_transformers_requirement_judges_version_model_and_vllm(transformers, has_model, vllm, ok):
    from minicpmv_ascend_plugin.core.transformers_check import problem

    message = problem(transformers, has_model, vllm)
    assert (message is None) == ok, message
    if message:
        assert "transformers==5.14.1" in message


def test_transformers_requirement_fails_vllm_start():
    """An unusable transformers stops vLLM's plugin loading with the plugin's message."""
    code = ("import minicpmv_ascend_plugin.core.transformers_check as t\n"
            "t.current_problem = lambda v: 'transformers 5.5.4 has no MiniCPM-V 4.6: install transformers==5.14.1'\n"
            "from vllm.plugins import load_general_plugins\nload_general_plugins()\n")
    proc = run_python(code)
    assert proc.returncode != 0
    assert "RuntimeError: minicpmv_ascend_plugin: transformers 5.5.4 has no MiniCPM-V 4.6" in proc.stderr


def test_version_tuples_and_sections():
    from types import SimpleNamespace

    from minicpmv_ascend_plugin.core.vllm_code import release
    from minicpmv_ascend_plugin.patches.model import rotary_mrope

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


def test_ascend_check_script_reports_this_targets_vllm_and_decisions(target):
    """The NPU users' check script on the target's vLLM (no server here: --no-requests)."""
    import subprocess

    import minicpmv_ascend_plugin as plugin

    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "ascend_check.py"), "--no-requests"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"platform: unspecified (-), vLLM {target.vllm}, vllm-ascend -, "
                               f"transformers {target.transformers_pin}, ")
    assert [line.split(" - ")[0] for line in lines[2:]] == [
        f"patch {p.name}: {'applied' if target.needs(p.name) else 'skipped'}" for p in plugin.PATCHES] + ["result: ok"]


def test_launcher_auto_reasoning_parser(loaded, target, monkeypatch):
    """Where vLLM has no `minicpmv` parser the plugin registers one, so the launcher's `auto` picks
    it (and vLLM's registry, after loading plugins, really has it and loads it, as the API server
    does when it starts: the `loaded` process); with the plugin off, `qwen3` (a process of its own;
    every spelling of off is the same switch)."""
    import minicpmv_ascend_plugin as plugin

    out, _ = loaded
    assert out["auto_reasoning_parser"] == "minicpmv" and out["minicpmv_parser"]
    code = textwrap.dedent("""
        from minicpmv_ascend import settings
        from vllm.plugins import load_general_plugins
        from vllm.reasoning import ReasoningParserManager
        load_general_plugins()
        chosen = settings.auto_reasoning_parser()
        ReasoningParserManager.get_reasoning_parser(chosen)
        print(chosen, "minicpmv" in ReasoningParserManager.list_registered())
    """)
    proc = run_python(code, env={"MINICPMV_ASCEND_PLUGIN": "off"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    chosen, registered = proc.stdout.split()[-2:]
    expected = "qwen3" if target.needs("reasoning-parser") else "minicpmv"
    assert chosen == expected
    assert registered == str(expected == "minicpmv")
    for word in ("0", "OFF", " false ", "no", "disabled"):
        monkeypatch.setenv("MINICPMV_ASCEND_PLUGIN", word)
        assert plugin.disabled(), word
