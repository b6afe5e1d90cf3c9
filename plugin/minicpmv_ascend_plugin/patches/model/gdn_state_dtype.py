"""Gated DeltaNet recurrent state in the checkpoint's dtype (float32), not silently bf16."""

from __future__ import annotations

from typing import Any

from ...core import config_hook
from ...core.patch import AT_REGISTER, Patch
from ...core.wrap import emit

NAME = "gdn-state-dtype"
DTYPES = ("float32", "bfloat16", "float16")
DEFAULT = "float32"


def state_dtype(text_config: Any) -> str:
    declared = getattr(text_config, "mamba_ssm_dtype", None)
    return declared if declared in DTYPES else DEFAULT


def hook(vllm_config: Any) -> None:
    cache_config = vllm_config.cache_config
    if cache_config.mamba_ssm_cache_dtype != "auto":
        return
    dtype = state_dtype(vllm_config.model_config.hf_text_config)
    cache_config.mamba_ssm_cache_dtype = dtype
    emit(f"minicpmv_ascend_plugin: mamba_ssm_cache_dtype auto -> {dtype} (the checkpoint's "
         "text_config.mamba_ssm_dtype, default float32)")


def check(_: Any) -> str | None:
    if config_hook.upstream_has_entry():
        return "vLLM has its own config hook for MiniCPM-V 4.6 (MODELS_CONFIG_MAP)"
    return None


def apply(_: Any) -> None:
    config_hook.add(NAME, hook)


PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary=f"Gated DeltaNet state dtype from the checkpoint ({DEFAULT}) when --mamba-ssm-cache-dtype is auto",
    upstream="vLLM applies Qwen3_5ForConditionalGenerationConfig to Qwen3.5 architectures only "
    "(vllm/model_executor/models/config.py, 0.23-0.33)",
    check=check,
    apply=apply,
    fixes=(f'`--mamba-ssm-cache-dtype auto` leaves the Gated DeltaNet state in bf16 although the checkpoint says {DEFAULT} '
     "(vLLM's Qwen3.5 config hook is not mapped to MiniCPM-V 4.6)"),
    tests='`test_config_hooks_in_vllmconfig`, `test_ascend_rotary_config_is_an_exact_noop`',
    delete_when='vLLM maps `MiniCPMV4_6ForConditionalGeneration` in `MODELS_CONFIG_MAP`',
    details=f"""
a config hook, run before the model is built, that sets
`mamba_ssm_cache_dtype` from `text_config.mamba_ssm_dtype` (default {DEFAULT}) only while it is
`auto`. The launcher already passes `--mamba-ssm-cache-dtype` from the checkpoint, so under the
launcher this changes nothing; it is there because users also start `vllm serve` (or
`vllm.LLM`) themselves with this image, and then the state would silently be bf16. It applies on
every platform because the gap is vLLM's (0.23 to 0.33), not Ascend's.
""",
    evidence={"0.30.0": ('applied', ('`model_executor/models/config.py:1001-1044`: `MODELS_CONFIG_MAP` maps the Qwen3.5 '
                         'architectures to `Qwen3_5ForConditionalGenerationConfig` (:801, copies `mamba_ssm_dtype` '
                         'at :811-814) and has no `MiniCPMV4_6ForConditionalGeneration`: `auto` stays `auto` without '
                         'the plugin'))},
)
