"""Speed limits: what this machine can do, and what one decode token of a checkpoint costs.

Two hardware numbers bound decoding:
  memory bandwidth   batch-1 decode reads every language-model weight once per token, so
                     tokens/s <= bandwidth / bytes read per token;
  bf16 matmul rate   at a large batch the weights are shared by the whole batch and the
                     arithmetic dominates: tokens/s <= matmul FLOP/s / FLOPs per token.

Both are measured here with torch on the CPU (the threads vLLM's CPU worker gets), or given as
parameters (an NPU's datasheet or a measurement on the NPU host). The per-token costs are computed
from the checkpoint's config.json and safetensors headers, so the same code works for the tiny and
the full preset (and for the released weights).
"""

from __future__ import annotations

import json
import math
import pathlib
import struct
import time
from typing import Any

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "I8": 1, "U8": 1, "BOOL": 1}
STATE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
TEXT_PREFIXES = ("model.language_model.", "language_model.", "llm.")


# --------------------------------------------------------------------------------------------
# Per-token cost of a checkpoint
# --------------------------------------------------------------------------------------------


def safetensors_shapes(model_dir: pathlib.Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, shape) for every tensor in the checkpoint, read from the file headers only."""
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        header.pop("__metadata__", None)
        tensors |= {name: (meta["dtype"], tuple(meta["shape"])) for name, meta in header.items()}
    if not tensors:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    return tensors


def decode_cost(model_dir: pathlib.Path, context_tokens: int = 0, state_dtype: str | None = None) -> dict[str, Any]:
    """Bytes read and FLOPs per decoded token of one sequence (batch 1), with the breakdown.

    Counted: every language-model layer weight and the final norm (read once per token), the
    output matrix (the tied embedding when tie_word_embeddings), one embedding row, the Gated
    DeltaNet recurrent and conv states (read and written every token, in the mamba cache dtype),
    and the KV cache of the full-attention layers over `context_tokens`. Not counted: the vision
    tower (it runs at prefill only) and activations (a few MB, cache-resident).
    """
    config = json.loads((model_dir / "config.json").read_text())
    text = config.get("text_config", config)
    tensors = safetensors_shapes(model_dir)
    tied = bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))

    layer_bytes = layer_params = 0
    embed = lm_head = None
    for name, (dtype, shape) in tensors.items():
        local = next((name[len(p):] for p in TEXT_PREFIXES if name.startswith(p)), None)
        if name.startswith("lm_head.") or name.endswith(".lm_head.weight"):
            lm_head = (dtype, shape)
        elif local is None:
            continue  # vision tower, merger: prefill only
        elif local.startswith("embed_tokens."):
            embed = (dtype, shape)
        elif local.startswith(("layers.", "norm.")):
            layer_params += math.prod(shape)
            layer_bytes += math.prod(shape) * DTYPE_BYTES[dtype]
    output = embed if (tied or lm_head is None) else lm_head
    if output is None:
        raise ValueError(f"{model_dir}: no output matrix (lm_head / embed_tokens) found")
    out_params = math.prod(output[1])
    out_bytes = out_params * DTYPE_BYTES[output[0]]
    hidden = int(text["hidden_size"])
    embed_row_bytes = hidden * DTYPE_BYTES[(embed or output)[0]]

    layer_types = text.get("layer_types") or ["full_attention"] * int(text["num_hidden_layers"])
    n_linear = sum(t == "linear_attention" for t in layer_types)
    n_full = sum(t == "full_attention" for t in layer_types)
    state_dtype = state_dtype or text.get("mamba_ssm_dtype") or "float32"
    heads_v = int(text.get("linear_num_value_heads", 0))
    heads_k = int(text.get("linear_num_key_heads", 0))
    dk, dv = int(text.get("linear_key_head_dim", 0)), int(text.get("linear_value_head_dim", 0))
    ssm_state = heads_v * dk * dv * STATE_DTYPE_BYTES.get(state_dtype, 4)
    conv_state = (int(text.get("linear_conv_kernel_dim", 4)) - 1) * (2 * heads_k * dk + heads_v * dv) * 2
    linear_state_bytes = 2 * n_linear * (ssm_state + conv_state)  # read and written back
    kv_heads, head_dim = int(text.get("num_key_value_heads", 0)), int(text.get("head_dim", 0))
    kv_bytes_per_context_token = n_full * 2 * kv_heads * head_dim * 2  # K and V, bf16
    kv_bytes = kv_bytes_per_context_token * context_tokens

    weight_bytes = layer_bytes + out_bytes + embed_row_bytes
    q_heads = int(text.get("num_attention_heads", 0))
    # Matmuls: 2 FLOPs per weight element. Attention: QK^T and PV over the context. Gated DeltaNet:
    # about three rank-1 passes over the dk x dv state per head (decay/update, correction, readout).
    matmul_flops = 2 * (layer_params + out_params)
    attention_flops = n_full * 4 * q_heads * head_dim * context_tokens
    linear_flops = n_linear * heads_v * 6 * dk * dv
    return {
        "checkpoint": str(model_dir),
        "context_tokens": context_tokens,
        "layer_weight_bytes": layer_bytes,
        "output_matrix_bytes": out_bytes,
        "output_matrix_tied": tied,
        "embedding_row_bytes": embed_row_bytes,
        "linear_state_bytes": linear_state_bytes,
        "linear_state_dtype": state_dtype,
        "kv_cache_bytes": kv_bytes,
        "kv_bytes_per_context_token": kv_bytes_per_context_token,
        "weight_bytes": weight_bytes,  # shared by every sequence of a batch
        "per_sequence_bytes": linear_state_bytes + kv_bytes,  # paid again by each sequence
        "bytes_per_token": weight_bytes + linear_state_bytes + kv_bytes,
        "flops_per_token": matmul_flops + attention_flops + linear_flops,
        "matmul_flops_per_token": matmul_flops,
        "language_model_params": layer_params + out_params,
    }


def bandwidth_ceiling(cost: dict[str, Any], bandwidth_gbs: float, batch: int = 1) -> float:
    """Tokens/s if every step only streamed its bytes at `bandwidth_gbs` (weights shared by the batch)."""
    step_bytes = cost["weight_bytes"] + batch * cost["per_sequence_bytes"]
    return batch * bandwidth_gbs * 1e9 / step_bytes


def compute_ceiling(cost: dict[str, Any], matmul_tflops: float) -> float:
    """Tokens/s if every step only did its FLOPs at the bf16 matmul rate."""
    return matmul_tflops * 1e12 / cost["flops_per_token"]


# --------------------------------------------------------------------------------------------
# This machine's limits
# --------------------------------------------------------------------------------------------


# The bf16 matmul is sized to the machine: from MATMUL_SIZES, the first whose one product takes at
# least MATMUL_MIN_S (big enough that the rate is the kernel's, not the call's overhead), and never
# one whose product would take longer than MATMUL_BUDGET_S / repeats. A CPU with AVX-512 BF16 reaches
# 4096 in ~0.1 s per product; one without (AVX2 only: torch's bf16 matmul at ~0.9 GFLOP/s against
# ~39 in fp32) would spend ~2.5 minutes per 4096 product, 15 minutes for the best of 5.
MATMUL_SIZES = (256, 512, 1024, 2048, 4096)
MATMUL_MIN_S = 0.05
MATMUL_BUDGET_S = 10.0


def matmul_rate_bf16(repeats: int = 5, budget_s: float = MATMUL_BUDGET_S) -> tuple[float, int]:
    """Best bf16 matmul rate in TFLOP/s and the size it was measured at, within about `budget_s`
    (the doubling from one size to the next is at most 8x the work of the size before)."""
    import torch

    rate, n = 0.0, MATMUL_SIZES[0]
    for n in MATMUL_SIZES:
        a = torch.randn(n, n).to(torch.bfloat16)
        b = torch.randn(n, n).to(torch.bfloat16)
        start = time.perf_counter()
        a @ b  # also the warm-up of this size
        once = time.perf_counter() - start
        rate = 2 * n**3 / once / 1e12
        if once >= MATMUL_MIN_S or once * 8 * repeats > budget_s:
            break
    for _ in range(repeats if once * repeats <= budget_s else 1):
        start = time.perf_counter()
        a @ b
        rate = max(rate, 2 * n**3 / (time.perf_counter() - start) / 1e12)
    return rate, n


def measure_hardware(threads: int = 2, buffer_mib: int = 1024, repeats: int = 5) -> dict[str, Any]:
    """Memory read bandwidth (sum over a buffer larger than the caches) and the bf16 matmul rate.

    Best of `repeats`: the limit is what the machine can do, noise only ever makes it slower.
    """
    import torch

    buf = torch.ones(buffer_mib * 2**20 // 4, dtype=torch.float32)
    dst = torch.empty_like(buf)

    def read_gbs(n_threads: int) -> float:
        torch.set_num_threads(n_threads)
        buf.sum()
        best = 0.0
        for _ in range(repeats):
            start = time.perf_counter()
            buf.sum()
            best = max(best, buf.nbytes / (time.perf_counter() - start) / 1e9)
        return best

    one_thread = read_gbs(1)  # what a single OpenMP thread (vLLM's auto binding on 2 cores) can pull
    read = read_gbs(threads)
    copy = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(buf)
        copy = max(copy, 2 * buf.nbytes / (time.perf_counter() - start) / 1e9)
    buf = dst = None  # free the buffers before the matmul (not `del`: read_gbs still names buf)

    tflops, n = matmul_rate_bf16(repeats)
    return {
        "source": "measured",
        "threads": threads,
        "mem_bandwidth_gbs": round(read, 2),
        "mem_bandwidth_1thread_gbs": round(one_thread, 2),
        "mem_copy_gbs": round(copy, 2),  # read + write; shown for comparison only
        "matmul_tflops_bf16": round(tflops, 4),
        "how": f"torch {torch.__version__}, {threads} threads: sum over a {buffer_mib} MiB float32 "
               f"buffer (read bandwidth), bf16 {n}x{n} @ {n}x{n} matmul (sized to take >= "
               f"{MATMUL_MIN_S} s, within ~{MATMUL_BUDGET_S:.0f} s); best of {repeats}",
    }


def kernel_floor(model_dir: pathlib.Path, threads: int, batch: int = 1, repeats: int = 5) -> dict[str, Any]:
    """Time one decode step's matrix products alone, with vLLM's own CPU GEMM (oneDNN, as its
    linear layers use on x86): every language-model weight and the output matrix, each its own
    buffer (together larger than the caches), one pass per step, best of `repeats`.

    The gap between this floor and the measured time per output token is everything else the
    engine does per step (recurrent-state kernels, attention, norms, sampling, scheduling, Python).
    """
    import torch
    from vllm import _custom_ops as ops

    torch.set_num_threads(threads)
    config = json.loads((model_dir / "config.json").read_text())
    text = config.get("text_config", config)
    tied = bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    shapes = []
    for name, (_dtype, shape) in safetensors_shapes(model_dir).items():
        local = next((name[len(p):] for p in TEXT_PREFIXES if name.startswith(p)), None)
        is_output = name.startswith("lm_head.") or (tied and local is not None and local.startswith("embed_tokens."))
        if len(shape) == 2 and (is_output or (local or "").startswith("layers.")):
            shapes.append((name, shape))
    layers = []
    for name, (n, k) in shapes:
        weight = torch.full((n, k), 0.01, dtype=torch.bfloat16)
        if n >= 64 and ops._supports_onednn:
            handler = ops.create_onednn_mm(weight.t(), 32)
            layers.append((name, k, lambda x, h=handler: ops.onednn_mm(h, x, None)))
        else:  # tiny projections (vLLM sends these to its small-GEMM kernel): negligible either way
            layers.append((name, k, lambda x, w=weight: torch.nn.functional.linear(x, w)))
    inputs = {k: torch.full((batch, k), 0.1, dtype=torch.bfloat16) for _, k, _ in layers}
    best = math.inf
    for _ in range(repeats + 1):  # the first pass warms oneDNN's primitives
        start = time.perf_counter()
        for _, k, matmul in layers:
            matmul(inputs[k])
        best = min(best, time.perf_counter() - start)
    weight_bytes = sum(math.prod(s) * 2 for _, s in shapes)
    return {"threads": threads, "batch": batch, "matrices": len(layers), "weight_bytes": weight_bytes,
            "step_ms": round(best * 1000, 2), "tokens_per_s": round(batch / best, 2),
            "effective_gbs": round(weight_bytes / best / 1e9, 2),
            "how": "vLLM's oneDNN GEMM (ops.onednn_mm) over every language-model weight, one pass = one step"}
