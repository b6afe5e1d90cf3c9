"""Ascend performance: MiniCPM-V 4.6's vision attention over packed slices, so the platform's fused kernel runs."""

from __future__ import annotations

import ast
import inspect
import textwrap
from types import ModuleType
from typing import Any

from ...core.patch import AT_MODEL_IMPORT, LayoutNotFound, Patch
from ...core.vllm_code import platform_name
from ...core.wrap import wrap_once

NAME = "vit-varlen-attention"

# Idefics2EncoderLayer.forward's statements (0.23, 0.30, 0.32) as `ast.unparse` writes them;
# `encoder_layer` below does the same with the attention made varlen.
LAYER_STATEMENTS = (
    "residual = hidden_states",
    "hidden_states = self.layer_norm1(hidden_states)",
    "hidden_states = self.self_attn(hidden_states, attention_mask=attention_mask)",
    "hidden_states += residual",
    "residual = hidden_states",
    "hidden_states = self.layer_norm2(hidden_states)",
    "hidden_states = self.mlp(hidden_states)",
    "hidden_states += residual",
    "return hidden_states",
)


def body_statements(function: Any) -> tuple[str, ...]:
    """A function's body statements as `ast.unparse` writes them (docstring dropped; `x = y + x`
    and `x = x + y` written `x += y`)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    statements = []
    for node in body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.BinOp) and isinstance(node.value.op, ast.Add)):
            name = node.targets[0].id
            sides = [node.value.left, node.value.right]
            same = [isinstance(side, ast.Name) and side.id == name for side in sides]
            if any(same):
                node = ast.AugAssign(target=node.targets[0], op=ast.Add(), value=sides[same.index(True) ^ 1])
        statements.append(ast.unparse(node))
    return tuple(statements)


def host_seqlens() -> bool:
    """Whether `cu_seqlens` and `max_seqlen` are made on the host: on the Ascend platform, whose
    `AscendMMEncoderAttention` reads them on the host in every layer (`cu_seqlens.cpu()`, then
    `.tolist()` for the fused kernel's `actual_seq_lengths`; `max_seqlen` unused): a device tensor
    there costs one device-to-host copy and sync per encoder layer. Elsewhere the platform's
    varlen kernels (CUDA's) take them on the device."""
    return platform_name() == "npu"


def seqlens(lengths: list[int], device: Any) -> tuple[Any, Any]:
    """(cu_seqlens, max_seqlen) for packed sequences of `lengths` (Python ints), as vLLM's varlen
    vision encoders build them (siglip2navit.py): int32 cumulative lengths with a leading 0, and the
    longest length as an int32 tensor; on the host where `host_seqlens()`, else on `device`."""
    import torch

    cumulative = [0]
    for n in lengths:
        cumulative.append(cumulative[-1] + n)
    where = "cpu" if host_seqlens() else device
    return (torch.tensor(cumulative, dtype=torch.int32, device=where),
            torch.tensor(max(lengths), dtype=torch.int32, device=where))


def slice_lengths(tgt_sizes: Any) -> list[int]:
    """Patches per slice (height x width of each row of `tgt_sizes`), as Python ints."""
    return [int(h) * int(w) for h, w in tgt_sizes.tolist()]


def attention(self_attn: Any, hidden_states: Any, cu_seqlens: Any, max_seqlen: Any) -> Any:
    """`Idefics2VisionAttention.forward` on a packed `(tokens, hidden)` sequence: its own
    projections, attention through its own `MMEncoderAttention` with `cu_seqlens`."""
    qkv, _ = self_attn.qkv_proj(hidden_states)
    query, key, value = qkv.chunk(3, dim=-1)
    out = self_attn.attn(query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0),
                         cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)
    out, _ = self_attn.out_proj(out.reshape(hidden_states.shape[0], -1))
    return out


def encoder_layer(layer: Any, hidden_states: Any, cu_seqlens: Any, max_seqlen: Any) -> Any:
    """`Idefics2EncoderLayer.forward` (LAYER_STATEMENTS) with the attention varlen."""
    residual = hidden_states
    hidden_states = layer.layer_norm1(hidden_states)
    hidden_states = attention(layer.self_attn, hidden_states, cu_seqlens, max_seqlen)
    hidden_states += residual
    residual = hidden_states
    hidden_states = layer.layer_norm2(hidden_states)
    hidden_states = layer.mlp(hidden_states)
    hidden_states += residual
    return hidden_states


def get_vision_hidden_states(self: Any, data: Any, downsample_mode: str | None = None,
                             original: Any = None) -> list[Any]:
    """vLLM's `get_vision_hidden_states` (same embeddings, layers, merger placement, results) with
    the encoder layers run over the packed valid patches of each slice. A batch whose slices all
    have one length is vLLM's own (`original`): vLLM pads and masks nothing there and already calls
    `MMEncoderAttention` (without `cu_seqlens`), so packing could only add work."""
    import torch

    pixel_values = data["pixel_values"]
    tgt_sizes = data["tgt_sizes"]
    lengths = slice_lengths(tgt_sizes)
    if original is not None and len(set(lengths)) == 1:
        return original(self, data, downsample_mode)
    batch = len(pixel_values)
    patch = pixel_values[0].shape[-2]
    longest = max(item.shape[-1] for item in pixel_values)
    device = pixel_values[0].device
    dtype = self.vpm.embeddings.patch_embedding.weight.dtype
    # The embeddings exactly as vLLM computes them: slices padded to the longest, one conv.
    all_pixel_values = torch.zeros(batch, 3, patch, longest, dtype=dtype, device=device)
    for i, pv in enumerate(pixel_values):
        all_pixel_values[i, ..., :pv.shape[-1]] = pv.to(dtype)
    patch_attn_mask = (torch.arange(max(lengths), device=device)[None, :]
                       < torch.tensor(lengths, device=device)[:, None])
    embedded = self.vpm.embeddings(all_pixel_values, patch_attention_mask=patch_attn_mask.unsqueeze(1),
                                   tgt_sizes=tgt_sizes)
    hidden_states = embedded[patch_attn_mask]  # (sum of lengths, hidden), slice after slice
    return encode(self, hidden_states, lengths, tgt_sizes, downsample_mode)


def encode(self: Any, hidden_states: Any, lengths: list[int], tgt_sizes: Any,
           downsample_mode: str | None) -> list[Any]:
    """The encoder layers, `vit_merger` and `merger` of `get_vision_hidden_states` over the packed
    `(sum of lengths, hidden)` embeddings of slices of `lengths` patches (`tgt_sizes` on any device)."""
    import torch

    device = hidden_states.device
    cu_seqlens, max_seqlen = seqlens(lengths, device)
    insert_layer_id = getattr(self.config, "insert_layer_id", -1)
    if downsample_mode is None:
        downsample_mode = getattr(self.config, "downsample_mode", "16x")
    use_vit_merger = downsample_mode != "4x" and insert_layer_id >= 0

    for layer in self.vpm.encoder.layers[:insert_layer_id + 1]:
        hidden_states = encoder_layer(layer, hidden_states, cu_seqlens, max_seqlen)
    if use_vit_merger:
        merged, sizes = [], []
        for b, part in enumerate(hidden_states.split(lengths)):
            out, size, _ = self.vit_merger(part.unsqueeze(0), tgt_sizes[b:b + 1], None)
            merged.append(out[0])
            sizes.append(size)
        hidden_states = torch.cat(merged)
        tgt_sizes = torch.cat(sizes)
        lengths = slice_lengths(tgt_sizes)
        cu_seqlens, max_seqlen = seqlens(lengths, device)
    for layer in self.vpm.encoder.layers[insert_layer_id + 1:]:
        hidden_states = encoder_layer(layer, hidden_states, cu_seqlens, max_seqlen)

    hidden_states = self.vpm.post_layernorm(hidden_states)
    return [self.merger(part.unsqueeze(0), tgt_sizes[b:b + 1])[0]
            for b, part in enumerate(hidden_states.split(lengths))]


def check(module: ModuleType) -> str | None:
    from vllm.model_executor.models import idefics2_vision_model as idefics2

    own = inspect.getsource(module.MiniCPMV4_6ForConditionalGeneration.get_vision_hidden_states)
    if "cu_seqlens" in own:
        return "vLLM's get_vision_hidden_states already runs the encoder over cu_seqlens (varlen)"
    if "attention_mask" not in own:
        raise LayoutNotFound("vLLM's get_vision_hidden_states builds no padded attention mask (nor runs varlen)")
    if "scaled_dot_product_attention" not in inspect.getsource(idefics2.Idefics2VisionAttention.forward):
        raise LayoutNotFound("vLLM's Idefics2VisionAttention has no masked SDPA path")
    parameters = inspect.signature(idefics2.MMEncoderAttention.forward_native).parameters
    if not {"cu_seqlens", "max_seqlen"} <= set(parameters):
        raise LayoutNotFound("vLLM's MMEncoderAttention takes no cu_seqlens/max_seqlen")
    statements = body_statements(idefics2.Idefics2EncoderLayer.forward)
    if statements != LAYER_STATEMENTS:
        raise LayoutNotFound("vLLM's Idefics2EncoderLayer.forward is not the pre-norm residual "
                             f"sequence this patch mirrors ({'; '.join(statements)})")
    return None


def apply(module: ModuleType) -> None:
    wrap_once(module.MiniCPMV4_6ForConditionalGeneration, "get_vision_hidden_states",
              lambda original: lambda self, data, downsample_mode=None: get_vision_hidden_states(
                  self, data, downsample_mode, original))


PATCH = Patch(
    name=NAME,
    stage=AT_MODEL_IMPORT,
    summary="MiniCPM-V 4.6's vision encoder over packed slices (cu_seqlens) through vLLM's "
    "MMEncoderAttention instead of padded masked SDPA (vllm-ascend's fused encoder attention runs)",
    upstream="none (vLLM 0.23 - 0.32 pad and mask; transformers' 4.6 vision model is varlen); "
    "vllm-ascend AscendMMEncoderAttention (#8671, #10549, #12084)",
    check=check,
    apply=apply,
    fixes=('not a bug but the path: sliced images (source and grid slices differ in patch count) and mixed encoder batches '
     "are padded and masked, and `Idefics2VisionAttention` then runs torch's SDPA instead of vLLM's "
     "`MMEncoderAttention`, so vllm-ascend's fused encoder attention (`AscendMMEncoderAttention`) never runs for "
     "them. The patch runs 4.6's (and 0.32's 4.7's) encoder over the packed slices with `cu_seqlens` through "
     '`MMEncoderAttention`'),
    tests=('`plugin/tests/patches/model/test_target_vit_varlen_attention.py` (each target), `tests/test_vit_varlen_attention.py` (0.32, 4.6 and '
     "4.7): the stand-in platform attention never called without, called per layer with the slices' `cu_seqlens` "
     "with; within the bf16 ulp bound of the masked path on a peaked tower, positive controls outside it; equal to "
     "transformers in fp32; `cu_seqlens` on the host on Ascend only (a stand-in on a fake device); equal-slice "
     "batches on vLLM's own path"),
    delete_when=("vLLM's MiniCPM-V 4.6 / Idefics2 encoder runs sliced batches varlen (`cu_seqlens`) itself, as transformers' "
     'does'),
    details=f"""
wraps `MiniCPMV4_6ForConditionalGeneration.get_vision_hidden_states`
(4.7 on 0.32 inherits it, so the wrapper covers it; `Idefics2VisionAttention`, shared with
Idefics3, SmolVLM and MiniCPM-V 2.x-4.5, is untouched). Which batches it takes: those whose slices
differ in patch count (a sliced image whose source slice and grid slices differ, e.g. 1344x1008:
1008 + 6 x 1024; 500x700: 1008 + 2 x 1120; any encoder batch of mixed sizes). A batch of one
length (448x448 and smaller: one slice; 1084x820: 7 x 1008; uniform video frames) goes to vLLM's
own method: vLLM masks nothing there and already calls `MMEncoderAttention` without `cu_seqlens`
(vllm-ascend's fused kernel runs), so packing could only add work. For the others, the embeddings
are computed as vLLM does (slices padded to the longest, one conv), then the valid patches of each
slice are packed into one `(tokens, 1152)` sequence; each encoder layer runs its own layer norms,
`qkv_proj`, `out_proj` and MLP, with attention through its own `MMEncoderAttention` given
`cu_seqlens` (int32, leading 0) and `max_seqlen` as vLLM's varlen encoders build them
(`siglip2navit.py`); the `vit_merger` (16x) and the `merger` are vLLM's modules called per slice
(they read only each slice's valid rows of the padded batch), and `cu_seqlens` is rebuilt after
the `vit_merger`. Both are made from the slice lengths (Python ints) on the host on the Ascend
platform (vLLM's platform `npu`) and on the model's device elsewhere (CUDA's varlen kernels read
them there): vllm-ascend's `AscendMMEncoderAttention` reads `cu_seqlens` on the host in every
layer (v0.23.0 and main of 2026-08-22: `_maybe_compute_cu_seqlens` returns `cu_seqlens.cpu()`,
`maybe_compute_actual_seq_lengths` takes `.tolist()` of it; `max_seqlen` unused), so a device
tensor would cost a device-to-host copy and sync per layer (26 per encoder call). Its
`forward_oot` takes a `(1, tokens, heads x 72)` query, TND layout,
`npu_fused_infer_attention_score`, head_dim 72 padded to 128 in each call.
Equality (`vit_varlen_check.py`, real attention shape, 2 layers, one call with a 1260x480 image in
3 slices of 192/240/240 patches at 224-px slicing and a 900x300 image in 5 slices of 48 + 4 x 64 at
112-px slicing, 16x and 4x; a tower with layer-norm gains 1 and q/k weights of std 0.04, so the
attention is peaked: layer 0's logits have std 1.9 and the median largest probability is 0.13
against 1/192 uniform). Measured on 0.30: the varlen bf16 output differs from the masked bf16 output
by a median of 0, a 99th percentile of 2 and at most 3.0-3.3 bf16 ulps (`ulps()`: at each element's
magnitude, those below the output's RMS at the RMS; max abs 0.125 on outputs up to ~29), where
masked bf16 vs masked fp32 differs by 1.0-1.5 / 4.9-7.2 / 9.4-12.1 ulps (max abs 0.37-0.38); the
bound is 4 ulps at the 99th percentile and 8 at the max, and the masked path's max abs. In fp32
varlen and masked agree to 2.5e-5 and both match transformers to 5e-5 (bound: 1 % of the bf16
floor). Positive controls, the same path with a fault planted in the attention, fail every bound:
its scale x1.1 (median 11 ulps, max abs 3.8), q and k swapped (median 94 ulps, max abs 24).
Predicate (read from the installed code): `get_vision_hidden_states` mentions `attention_mask`
and not `cu_seqlens`, `Idefics2VisionAttention.forward` has its `scaled_dot_product_attention` path,
`MMEncoderAttention.forward_native` takes `cu_seqlens` and `max_seqlen`, and
`Idefics2EncoderLayer.forward`'s statements (by `ast`) are the pre-norm residual sequence the
patch mirrors; a changed layer is "layout not found" (unapplied, a warning). Not handled: vLLM's
FlashInfer encoder backend (CUDA only), which wants padded `cu_seqlens` and `sequence_lengths`
(`MMEncoderAttention.maybe_recompute_cu_seqlens`); the CPU runs `_forward_sdpa`, which loops over
the slices. Switch it off alone with `MINICPMV_ASCEND_PLUGIN=off:{NAME}`.
""",
    evidence={"0.30.0": ('applied', ('`minicpmv4_6.py:1137`: `get_vision_hidden_states` builds an additive float mask whenever a '
                         "slice is shorter than the batch's longest (`if torch.any(~patch_attn_mask)`), and the "
                         '`vit_merger` rebuilds it (:850); `idefics2_vision_model.py:218-235`: '
                         '`Idefics2VisionAttention.forward` calls `MMEncoderAttention` only when `attention_mask is '
                         'None`, else `F.scaled_dot_product_attention` on padded tensors (0.23: '
                         '`minicpmv4_6.py:1076`, `idefics2_vision_model.py:185-202`; 0.32: `:1346`, `:217-234`)'))},
)
