"""vLLM-CPU: a prompt of exactly one token no longer kills the engine (GDN prefill conv)."""

from __future__ import annotations

import functools
from typing import Any

from ...core.patch import AT_REGISTER, LayoutNotFound, Patch
from ...core.vllm_code import platform_name, require_source
from ...core.wrap import wrap_once

NAME = "gdn-one-token-prefill"
GDN_CPU = "model_executor/layers/mamba/ops/cpu/gdn_attention.py"
# The decision on a CPU without the kernel (no AVX-512 BF16): the patch table's CPU column holds the
# decision of a CPU with it (tests/test_plugin_targets.py accepts this one in its place).
NO_KERNEL_HERE = ("this CPU's vLLM-CPU kernels have no causal_conv1d_fwd_cpu (built for AVX-512 BF16 only): "
                  "the GDN prefill takes vLLM's Python conv path")
CALL = "ops.causal_conv1d_fwd_cpu("
ERROR = "expect x to be transposed"


def expected_layout(x: Any) -> Any:
    """`x` ([dim, tokens] or [batch, dim, tokens]) copied into the kernel's layout: dim
    contiguous, tokens next (`stride(-2) == 1 and stride(-1) == size(-2)`)."""
    import torch

    strides = [1, x.size(-2)] if x.dim() == 2 else [x.size(-2) * x.size(-1), 1, x.size(-2)]
    fixed = torch.empty_strided(x.shape, strides, dtype=x.dtype, device=x.device)
    fixed.copy_(x)
    return fixed


def fits(x: Any) -> bool:
    return x.stride(-2) == 1 and x.stride(-1) == x.size(-2)


def _causal_conv1d_fwd_cpu(original: Any) -> Any:
    @functools.wraps(original)
    def causal_conv1d_fwd_cpu(x: Any, *args: Any, **kwargs: Any) -> Any:
        if x.dim() in (2, 3) and x.size(-1) == 1 and not fits(x):
            x = expected_layout(x)
        return original(x, *args, **kwargs)

    return causal_conv1d_fwd_cpu


def probe_input(dim: int = 64, extra: int = 64) -> dict[str, Any]:
    """A one-token prefill as vLLM's CPU GDN layer builds it: a column slice of a wider
    projection, `.contiguous()` (a no-op for one row), transposed to [dim, 1]."""
    import torch

    projection = torch.randn(1, dim + extra, dtype=torch.bfloat16)
    mixed_qkv = projection.split([dim, extra], dim=-1)[0].contiguous()
    conv_states = torch.zeros(1, 3, dim, dtype=torch.bfloat16).transpose(1, 2)  # vLLM's SD cache
    return {
        "x": mixed_qkv.transpose(0, 1),
        "weight": torch.randn(dim, 4, dtype=torch.bfloat16),
        "bias": None,
        "conv_states": conv_states,
        "query_start_loc": torch.tensor([0, 1], dtype=torch.int32),
        "cache_indices": torch.tensor([0], dtype=torch.int32),
        "has_initial_state": torch.tensor([False]),
        "silu_activation": True,
        "is_weight_packed": False,
    }


def probe() -> BaseException | None:
    """What vLLM's own `causal_conv1d_fwd_cpu` does with a one-token prefill (None: it works)."""
    import vllm._custom_ops as ops

    op = ops.causal_conv1d_fwd_cpu
    op = getattr(op, "_minicpmv_ascend_plugin_wraps", op)  # vLLM's, not ours
    try:
        op(**probe_input())
    except Exception as error:  # noqa: BLE001 - what the kernel raises is what is probed
        return error
    return None


def check(_: Any) -> str | None:
    # The platform first: off vLLM-CPU the kernel never runs, whatever vLLM's source looks like.
    platform = platform_name()
    if platform != "cpu":
        return f"platform {platform} does not run vLLM-CPU's GDN conv kernel"
    path, source = require_source(GDN_CPU)
    if CALL not in source:
        raise LayoutNotFound(f"vLLM's {path} has no CPU GDN prefill through ops.causal_conv1d_fwd_cpu")
    import vllm._custom_ops as ops

    if not hasattr(ops, "causal_conv1d_fwd_cpu"):
        raise LayoutNotFound("vllm._custom_ops has no causal_conv1d_fwd_cpu")
    import torch

    # vLLM-CPU builds the kernel only into its AVX-512 BF16 library (`vllm._C`); on other x86 CPUs
    # it loads `_C_AVX512` / `_C_AVX2` without it, and its GDN prefill takes the Python conv path
    # (gdn_attention.py: `use_cpp_conv = torch.cpu._is_avx512_bf16_supported() or is_arm_bf16()`).
    if not hasattr(torch.ops._C, "causal_conv1d_fwd_cpu"):
        return NO_KERNEL_HERE
    error = probe()
    if error is None:
        return "vLLM's causal_conv1d_fwd_cpu accepts a one-token prefill"
    if ERROR not in str(error):
        return f"vLLM's causal_conv1d_fwd_cpu fails a one-token prefill otherwise: {type(error).__name__}: {error}"
    return None


def apply(_: Any) -> None:
    import vllm._custom_ops as ops

    wrap_once(ops, "causal_conv1d_fwd_cpu", _causal_conv1d_fwd_cpu)


PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary="vLLM-CPU GDN prefill of a one-token prompt: x re-laid into the conv kernel's layout "
            f"(the engine died with 'causal_conv1d_fwd_cpu: {ERROR}')",
    upstream=("none found; vLLM-CPU causal_conv1d_fwd_cpu checks the stride of a size-1 token axis (0.32; vLLM "
              "#51565 made a one-token first chunk a prefill, which reaches this check)"),
    check=check,
    apply=apply,
    fixes=(f'vLLM-CPU only: a prompt of exactly one token kills the engine (`RuntimeError: causal_conv1d_fwd_cpu: {ERROR}.`); '
           'every request in flight gets 500 and the server stops'),
    tests=('`test_one_token_prompt_kills_the_engine_without_the_plugin`, `test_one_token_conv_kernel_probe_and_fix`; '
     '`test_one_token_prompt_logprobs_equal_the_longer_prompts` and the one-token rows of '
     '`tests/test_bad_requests.py` (200, server healthy)'),
    delete_when='the probe passes: the kernel accepts a one-token prefill as vLLM lays it out',
    details=f"""
vLLM-CPU's Gated DeltaNet prefill hands its conv kernel
`x = mixed_qkv.transpose(0, 1)`, where `mixed_qkv` is a column slice of the fused projection
(`mixed_qkvz.split(...)`, `vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:1121` in
0.32) passed through `.contiguous()` (`ops/cpu/gdn_attention.py:228`). With two or more tokens
that copies. With one token the `[1, qkv]` view already counts as contiguous (PyTorch ignores the
stride of a size-1 dimension), so it keeps the projection's row stride. The kernel
(`csrc/cpu/sgl-kernels/conv.cpp`) checks `x.stride(-1) == x.size(-2)` and raises. Only a FIRST
chunk of one token is a prefill. Since vLLM #51565 (the fix of vLLM issue #51562: a stateless
first chunk must not read a recycled state) it is no longer run as a decode. A one-token
remainder of a longer prompt is still a decode, so 2, 64 or 65 tokens (also with a 64-token
budget) never failed. The patch wraps `vllm._custom_ops.causal_conv1d_fwd_cpu`, the only way to
the kernel: a one-token x that fails the check is copied into the layout the kernel checks for
(the same values, bit for bit). Numerics: the kernel's output and conv state for the token are
bitwise those of the same token as the first of a two-token prefill. End to end, the first
generated token's top-5 logprobs after `[100]` (and after the one-token text `"a"`) equal the
prompt logprobs at position 1 of `[100, 7, 8, 9]`: an ordinary multi-token prefill, which
at position 0 sees only that token. Measured on the CPU server: max |difference| 0.0.
Predicate: vLLM's CPU GDN source (`{GDN_CPU}`) calls `{CALL}`, the platform is CPU, and
the op, called with a one-token x built the way vLLM builds it (a column slice,
`.contiguous()`, transposed), raises "{ERROR}". vLLM 0.23's Python code has the
same CPU path (`gdn_attention.py:77, :162`). Its GDN metadata, however, still ran a one-token
first chunk as a decode (the recycled-state bug), and `.venv-vllm023` is a CUDA build without
the CPU kernel, so there the patch says "platform unspecified". vLLM 0.30's Python code has the
CPU path too (`gdn_attention.py:125, :213`); `.venv-vllm030` is likewise a CUDA build: "platform
unspecified". Chat requests never reach
this: the chat template makes even an empty message 6 tokens or more, and request chat
templates need `--trust-request-chat-template`. On Ascend, see `docs/deploy-ascend.md`,
checklist item 17.
""",
    evidence={"0.30.0": ('not here', ("a vLLM-CPU kernel's bug: 0.30 has the CPU GDN path "
                         f'(`{GDN_CPU}:125, :213`), but the predicate runs '
                         'only on platform `cpu` (this CUDA wheel: "unspecified"; Ascend runs vllm-ascend\'s '
                         'kernels)'))},
)
