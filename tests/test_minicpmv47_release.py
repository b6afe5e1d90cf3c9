"""MiniCPM-V 4.7 as it may be released, before any weight loads: canvas M-RoPE guaranteed (the
launcher adds the field vLLM reads, or refuses a config that says sequential), the MoE variant and
a 4.7 hub id on a vLLM without 4.7 refused with exit 2. The planted configs are the kit's own tiny
4.7 checkpoint's with one field changed.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import types

import pytest

from minicpmv_ascend import vllm_source
from minicpmv_ascend.common.models import MODELS, is_moe_id, model_for_id
from minicpmv_ascend.common.release_shape import CANVAS_OVERRIDE, says_canvas
from minicpmv_ascend.settings import ConfigError, build_plan, resolve
from support.launcher import copy_checkpoint

REPO = pathlib.Path(__file__).resolve().parents[1]
M46, M47 = MODELS["minicpmv4_6"], MODELS["minicpmv4_7"]
ASCEND_FIX = {"text_config": {"rope_parameters": {"mrope_section": [11, 11, 10], "mrope_interleaved": True}}}


def planted(tiny_config_47: pathlib.Path, target: pathlib.Path, text_config: dict | None = None,
            **top: object) -> pathlib.Path:
    """A copy of the tiny 4.7 checkpoint whose config.json has `top` keys set (None: removed)."""
    copy_checkpoint(tiny_config_47, target)
    path = target / "config.json"
    config = json.loads(path.read_text())
    for key, value in top.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    config["text_config"].update(text_config or {})
    path.write_text(json.dumps(config))
    return target


def plan_for(model: str | pathlib.Path, **env: str):
    environ = {"MODEL_PATH": str(model), **env}
    return build_plan(resolve([], environ), environ, "cpu")


def overrides(plan) -> dict | None:
    args = plan.vllm_args
    return json.loads(args[args.index("--hf-overrides") + 1]) if "--hf-overrides" in args else None


# --------------------------------------------------------------------------------------------
# Canvas M-RoPE
# --------------------------------------------------------------------------------------------


def test_a_47_config_without_the_canvas_field_gets_it_as_an_override_in_the_plan(tiny_config_47, tmp_path):
    """vLLM reads `mrope_mode` / `uses_mrope_canvas` (not transformers' config class): a release
    without either would get sequential positions silently. The plan adds the field and says why."""
    assert says_canvas(json.loads((tiny_config_47 / "config.json").read_text()))
    assert overrides(plan_for(tiny_config_47)) is None  # the kit's checkpoint carries the field
    bare = planted(tiny_config_47, tmp_path / "bare", mrope_mode=None)
    plan = plan_for(bare)
    assert overrides(plan) == CANVAS_OVERRIDE == {"mrope_mode": "canvas"}
    note = next(n for n in plan.notes if "mrope_mode" in n)
    assert "uses_mrope_canvas" in note and "sequential positions" in note
    # merged with the operator's HF_OVERRIDES (the Ascend M-RoPE fix of env/ascend.env)
    merged = plan_for(bare, HF_OVERRIDES=json.dumps(ASCEND_FIX))
    assert overrides(merged) == {**ASCEND_FIX, **CANVAS_OVERRIDE}
    # either field that vLLM reads is enough
    flagged = planted(tiny_config_47, tmp_path / "flag", mrope_mode=None, uses_mrope_canvas=True)
    assert overrides(plan_for(flagged)) is None
    named = planted(tiny_config_47, tmp_path / "named", mrope_mode="canvas_3d")
    assert overrides(plan_for(named)) is None


def test_a_47_config_that_says_sequential_is_refused_naming_the_field(tiny_config_47, tmp_path):
    seq = planted(tiny_config_47, tmp_path / "seq", mrope_mode="sequential")
    with pytest.raises(ConfigError) as info:
        plan_for(seq)
    err = info.value
    assert err.key == "hf_overrides" and "mrope_mode: \"sequential\"" in err.why
    assert '{"mrope_mode": "canvas"}' in err.fix and '{"mrope_mode": "sequential"}' in err.fix
    # the operator's HF_OVERRIDES naming the field is the decision, either way
    assert overrides(plan_for(seq, HF_OVERRIDES='{"mrope_mode": "canvas"}')) == CANVAS_OVERRIDE
    assert overrides(plan_for(seq, HF_OVERRIDES='{"mrope_mode": "sequential"}')) == {"mrope_mode": "sequential"}
    off = planted(tiny_config_47, tmp_path / "off", mrope_mode=None, uses_mrope_canvas=False)
    with pytest.raises(ConfigError, match="uses_mrope_canvas: false"):
        plan_for(off)


def test_a_46_config_gets_no_canvas_override(tiny_config):
    assert overrides(plan_for(tiny_config)) is None
    assert overrides(plan_for(tiny_config, HF_OVERRIDES=json.dumps(ASCEND_FIX))) == ASCEND_FIX


@pytest.mark.slow
def test_vllms_own_canvas_switch_reads_the_override(tiny_config_47, tmp_path):
    """vLLM's config loading with the plan's --hf-overrides, then vLLM's own `_init_canvas_mrope`
    on that config: canvas with the override, sequential without (what the override prevents)."""
    from vllm.config import ModelConfig
    from vllm.model_executor.models.minicpmv4_7 import MiniCPMV4_7ForConditionalGeneration

    bare = planted(tiny_config_47, tmp_path / "bare", mrope_mode=None)

    def uses_canvas(hf_overrides: dict | None) -> bool:
        config = ModelConfig(model=str(bare), tokenizer=str(bare), dtype="bfloat16", max_model_len=4096,
                             hf_overrides=hf_overrides or {})
        model = types.SimpleNamespace(config=config.hf_config)
        MiniCPMV4_7ForConditionalGeneration._init_canvas_mrope(model, types.SimpleNamespace(model_config=config))
        return model._uses_canvas_mrope

    assert uses_canvas(None) is False
    assert uses_canvas(overrides(plan_for(bare))) is True


# --------------------------------------------------------------------------------------------
# The MoE variant and hub ids
# --------------------------------------------------------------------------------------------


def test_a_moe_47_config_is_refused_naming_its_text_model(tiny_config_47, tmp_path):
    moe = planted(tiny_config_47, tmp_path / "moe", text_config={"model_type": "qwen3_5_moe_text"})
    with pytest.raises(ConfigError) as info:
        plan_for(moe)
    err = info.value
    assert err.key == "model_path" and "text_config.model_type 'qwen3_5_moe_text'" in err.why
    assert "mixture-of-experts" in err.why and "Qwen3_5ForCausalLM" in err.why
    assert M47.modelscope_id in err.fix


def test_hub_ids_name_their_model_and_a_moe_by_its_active_parameters():
    assert model_for_id("OpenBMB/MiniCPM-V-4.7-1B") == (M47, True)
    assert model_for_id("openbmb/MiniCPM-V-4.7") == (M47, False)
    assert model_for_id("OpenBMB/MiniCPM-V-4.6") == (M46, False)
    assert model_for_id("someone/fine-tune") == (None, False)
    assert model_for_id("x/MiniCPM-V-4.71") == (None, False)
    assert is_moe_id("OpenBMB/MiniCPM-V-4.7-35B-A3B") and not is_moe_id("OpenBMB/MiniCPM-V-4.7-1B")


def _vllm_without(monkeypatch, model_type: str, version: str) -> None:
    """This vLLM seen as one without `model_type`'s code (the check reads vLLM's files)."""
    has_model = vllm_source.has_model
    monkeypatch.setattr(vllm_source, "has_model", lambda t: False if t == model_type else has_model(t))
    monkeypatch.setattr(vllm_source, "version", lambda: version)


@pytest.mark.parametrize("model_id", ["OpenBMB/MiniCPM-V-4.7-1B", "openbmb/MiniCPM-V-4.7"])
def test_a_47_hub_id_on_a_vllm_without_47_is_refused_before_the_download(model_id, monkeypatch):
    _vllm_without(monkeypatch, "minicpmv4_7", "0.30.0")
    with pytest.raises(ConfigError) as info:
        plan_for(model_id, VLLM_USE_MODELSCOPE="true")
    assert "needs vLLM >= 0.32.0" in info.value.why and "this vLLM (0.30.0)" in info.value.why
    # 4.6's id on the same vLLM is served
    assert plan_for(M46.modelscope_id, VLLM_USE_MODELSCOPE="true").served is M46


def test_a_47_hub_id_on_this_vllm_is_served_with_the_canvas_override_and_an_undeclared_one_noted():
    plan = plan_for(M47.modelscope_id, VLLM_USE_MODELSCOPE="true")
    assert plan.served is M47 and overrides(plan) == CANVAS_OVERRIDE
    assert not [n for n in plan.notes if "not the declared download" in n]
    other = plan_for("openbmb/MiniCPM-V-4.7", VLLM_USE_MODELSCOPE="true")
    assert other.served is M47 and any("not the declared download of MiniCPM-V 4.7" in n for n in other.notes)


def test_a_moe_47_hub_id_is_refused(monkeypatch):
    with pytest.raises(ConfigError) as info:
        plan_for("OpenBMB/MiniCPM-V-4.7-35B-A3B", VLLM_USE_MODELSCOPE="true")
    assert "mixture-of-experts MiniCPM-V 4.7" in info.value.why and M47.modelscope_id in info.value.fix


@pytest.mark.slow
def test_the_launcher_exits_2_on_a_moe_hub_id_before_loading(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO / "src"),
           "MODEL_PATH": "OpenBMB/MiniCPM-V-4.7-35B-A3B", "VLLM_USE_MODELSCOPE": "true"}
    process = subprocess.run([sys.executable, str(REPO / "entrypoint.py"), "--dry-run"], capture_output=True,
                             text=True, timeout=120, env=env, cwd=tmp_path)
    assert process.returncode == 2, process.stdout + process.stderr
    assert "mixture-of-experts" in process.stderr


# --------------------------------------------------------------------------------------------
# What the release carries: downsample_mode, processor classes, the chat template
# --------------------------------------------------------------------------------------------

VERIFY = REPO / "scripts" / "verify_model_dir.py"


def verify(model_dir: pathlib.Path) -> tuple[int, dict]:
    from support.server import clean_env

    result = subprocess.run([sys.executable, str(VERIFY), str(model_dir), "--json"], capture_output=True,
                            text=True, timeout=60, env=clean_env())
    return result.returncode, json.loads(result.stdout)


def edit_json(path: pathlib.Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def edit_template(model_dir: pathlib.Path, old: str, new: str) -> None:
    path = model_dir / "chat_template.jinja"
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new))


def refusal(model_dir: pathlib.Path) -> str:
    with pytest.raises(ConfigError) as info:
        plan_for(model_dir)
    assert info.value.key == "model_path" and "not servable as MiniCPM-V 4.7" in info.value.why
    return info.value.why


def shape_notes(model_dir: pathlib.Path) -> list[str]:
    return [n for n in plan_for(model_dir).notes if "release shape" in n]


def test_the_kits_47_checkpoint_has_the_release_shape_it_checks(tiny_config_47):
    assert shape_notes(tiny_config_47) == []
    code, report = verify(tiny_config_47)
    assert code == 0 and report["warnings"] == [] and report["not_servable"] == []


def test_downsample_mode_unknown_is_exit_2_missing_is_a_warning(tiny_config_47, tmp_path):
    bad = copy_checkpoint(tiny_config_47, tmp_path / "bad")
    edit_json(bad / "config.json", lambda c: c.update(downsample_mode="8x"))
    assert 'downsample_mode "8x": the processor knows only 16x and 4x' in refusal(bad)
    code, report = verify(bad)
    assert code == 4 and "downsample_mode" in report["not_servable"][0]
    absent = copy_checkpoint(tiny_config_47, tmp_path / "absent")
    edit_json(absent / "config.json", lambda c: c.pop("downsample_mode"))
    assert ["no downsample_mode" in n for n in shape_notes(absent)] == [True]
    code, report = verify(absent)
    assert code == 0 and ["no downsample_mode" in w for w in report["warnings"]] == [True]


def test_processor_classes_against_the_installed_transformers(tiny_config_47, tmp_path):
    """The upstream draft's MiniCPMV4_7ImageProcessor: this transformers (5.19) has no such class,
    and AutoProcessor then fails ("Unrecognized image processor"): exit 2 in the launcher; the host's
    check, without transformers, warns that it differs from what the kit's transformers maps."""
    draft = copy_checkpoint(tiny_config_47, tmp_path / "draft")
    edit_json(draft / "processor_config.json",
              lambda p: p["image_processor"].update(image_processor_type="MiniCPMV4_7ImageProcessor"))
    assert "image_processor_type MiniCPMV4_7ImageProcessor, which this transformers has not" in refusal(draft)
    code, report = verify(draft)
    assert code == 0 and report["warnings"] == [
        "the processor config names image_processor_type MiniCPMV4_7ImageProcessor where the kit's "
        "transformers maps minicpmv4_7 to MiniCPMV4_6ImageProcessor"]
    # a class this transformers has, other than the declared one: served, with the note
    pil = copy_checkpoint(tiny_config_47, tmp_path / "pil")
    edit_json(pil / "processor_config.json",
              lambda p: p["image_processor"].update(image_processor_type="MiniCPMV4_6ImageProcessorPil"))
    assert ["MiniCPMV4_6ImageProcessorPil" in n for n in shape_notes(pil)] == [True]


def test_a_template_without_the_thinking_switch_is_a_warning(tiny_config_47, tmp_path):
    fixed = copy_checkpoint(tiny_config_47, tmp_path / "fixed")
    edit_template(fixed, "enable_thinking is defined and enable_thinking is false", "false")
    notes = shape_notes(fixed)
    assert len(notes) == 1 and "with enable_thinking false" in notes[0] and "not switched off" in notes[0]
    code, report = verify(fixed)
    assert code == 0 and ["never reads enable_thinking" in w for w in report["warnings"]] == [True]


def test_a_template_with_another_tool_call_format_is_a_warning(tiny_config_47, tmp_path):
    other = copy_checkpoint(tiny_config_47, tmp_path / "other")
    edit_template(other, "'<tool_call>\\n<function=' + call.name + '>\\n'",
                  "'<tool_call>\\n{\"name\": \"' + call.name + '\"}\\n'")
    notes = shape_notes(other)
    assert len(notes) == 1 and "not qwen3_coder's" in notes[0] and '{"name": "get_weather"}' in notes[0]
    # the template still mentions the format in its tools prompt: the host's text check cannot tell
    assert verify(other)[0] == 0


def test_a_template_that_fails_to_render_or_is_missing_is_exit_2(tiny_config_47, tmp_path):
    broken = copy_checkpoint(tiny_config_47, tmp_path / "broken")
    (broken / "chat_template.jinja").write_text("{{ raise_exception('unsupported role') }}")
    assert "does not render a conversation with a tool call" in refusal(broken)
    none = copy_checkpoint(tiny_config_47, tmp_path / "none")
    (none / "chat_template.jinja").unlink()
    assert "no chat template" in refusal(none)
    code, report = verify(none)
    assert code == 4 and "no chat template" in report["not_servable"][0]
