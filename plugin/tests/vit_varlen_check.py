"""The `vit-varlen-attention` patch checked on one vLLM's own code at MiniCPM-V 4.6's real attention
shape (hidden 1152, 16 heads, head_dim 72; intermediate 4304) with a few layers: used in-process by
plugin/tests/patches/model/test_target_vit_varlen_attention.py on each Ascend target's vLLM, and run as a script
(`python plugin/tests/vit_varlen_check.py CHECKPOINT`, one `RESULT {json}` line) by
tests/test_vit_varlen_attention.py on the CPU stack's vLLM 0.32.

The same slices (transformers' own MiniCPM-V 4.6 image processor on real image sizes that slice:
the source slice and the grid slices differ in patch count) go through:
- vLLM's masked path (the patch off) in fp32 and in bf16: their difference is the noise floor;
- the patch (varlen over `cu_seqlens`) in fp32 and in bf16;
- transformers' MiniCPM-V 4.6 vision model and merger (fp32; its attention is varlen too), whose
  random weights are loaded into vLLM's modules by vLLM's own `load_weights`.
The encoder attention modules are replaced by a STAND-IN for a platform's `MMEncoderAttention`
(vllm-ascend's `AscendMMEncoderAttention` is one; it is not importable off an NPU): a subclass of
vLLM's class that records the `cu_seqlens` it is called with and computes with vLLM's own code.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import sys
from typing import Any

from _target import vision_model

HIDDEN, HEADS, INTERMEDIATE = 1152, 16, 4304  # MiniCPM-V 4.6's SigLIP tower (head_dim 72)
LAYERS, INSERT_LAYER_ID = 2, 0  # layer 0, the vit_merger (16x), layer 1
# (width, height, max_slice_nums, scale_resolution): a 1260x480 photo cut into 3 slices of two patch
# counts (the source 8x24 = 192, the grid 2 x 12x20 = 240: vLLM pads and masks them), one encoder
# batch. Slices of 224 px instead of the released 448 (at most 256 patches instead of 1,024): the
# path taken depends only on the lengths differing, and a quarter of the patches is ~1/4 of the
# linear work and ~1/16 of the attention's (bf16 matmuls are ~40x slower than fp32 on an AVX2-only
# CPU, and this check runs once per target). --bench keeps the released slicing.
# A second image, 900x300 cut into 5 slices at 112-px slicing (48, then 4 x 64 patches), goes in the
# same call: images of different slice counts in one `get_vision_hidden_states` batch (8 slices,
# 4 lengths).
IMAGES = ((1260, 480, 2, 224), (900, 300, 5, 112))


def real_dim_config(hf_config: Any) -> Any:
    """The checkpoint's config with the released vision attention shape and LAYERS layers."""
    config = copy.deepcopy(hf_config)
    vision = config.vision_config
    vision.hidden_size, vision.num_attention_heads, vision.intermediate_size = HIDDEN, HEADS, INTERMEDIATE
    vision.num_hidden_layers = LAYERS
    vision.insert_layer_id = config.insert_layer_id = INSERT_LAYER_ID
    config.drop_vision_last_layer = False
    return config


# The random tower's attention must be peaked, as a trained tower's is, or the checks cannot see an
# error in the attention weights: with every weight randn*0.05 (layer-norm gains included) layer 0's
# logits have std ~0.015 and attention is uniform to 5 % (max probability 0.0044 against 1/240), so
# a wrong softmax temperature, a doubled scale, q and k swapped or q = 0 all give nearly the same
# output. Layer-norm gains 1 make the normalized input unit-variance; q and k weights of std QK_STD
# then give logits of std ~HIDDEN * QK_STD**2 (~1.8), checked in verify() from what the stand-in sees.
WEIGHT_STD, QK_STD = 0.05, 0.04


def transformers_model(config: Any, seed: int = 1) -> tuple[Any, Any]:
    """transformers' MiniCPM-V 4.6 vision model and merger (fp32, SDPA), random weights: layer-norm
    gains 1 (biases, like every other weight, randn * WEIGHT_STD), the encoder layers' q and k
    weights randn * QK_STD (peaked attention)."""
    import torch
    from transformers.models.minicpmv4_6 import modeling_minicpmv4_6 as hf

    config = copy.deepcopy(config)
    config.vision_config._attn_implementation = "sdpa"
    vision, merger = hf.MiniCPMV4_6VisionModel(config.vision_config), hf.MiniCPMV4_6Merger(config)
    gains = {id(m.weight) for m in [*vision.modules(), *merger.modules()] if isinstance(m, torch.nn.LayerNorm)}
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in [*vision.named_parameters(), *merger.named_parameters()]:
            noise = torch.randn(param.shape, generator=generator)
            if id(param) in gains:
                param.fill_(1.0)
            elif name.startswith("encoder.layers.") and name.endswith(("q_proj.weight", "k_proj.weight")):
                param.copy_(noise * QK_STD)
            else:
                param.copy_(noise * WEIGHT_STD)
    return vision.eval(), merger.eval()


def load_transformers_weights(model: Any, vision: Any, merger: Any) -> None:
    """transformers' weights into vLLM's modules, through vLLM's own `load_weights` (its mapper
    stacks q/k/v and renames `model.vision_tower.*`), held to vLLM's loader's own completeness
    check (layers with a quant method count as loaded: vLLM 0.23 does not report the vit_merger's
    stacked q/k/v, which it loads). The fp32 comparison with transformers checks every value."""
    weights = [(f"model.vision_tower.{k}", v) for k, v in vision.state_dict().items()]
    weights += [(f"model.merger.{k}", v) for k, v in merger.state_dict().items()]
    loaded = set(model.load_weights(iter(weights)))
    for name, module in model.named_modules():
        if getattr(module, "quant_method", None) is not None:
            loaded |= {f"{name}.{p}" for p, _ in module.named_parameters()}
    missing = {name for name, _ in model.named_parameters()} - loaded
    assert not missing, f"vLLM parameters not loaded from transformers' weights: {sorted(missing)}"


def finish_loading(model: Any) -> None:
    """What vLLM's loader does after `load_weights` for unquantized linear layers (vLLM-CPU picks
    its GEMM kernel there: `cpu_linear`)."""
    for module in model.modules():
        quant_method = getattr(module, "quant_method", None)
        if quant_method is not None and hasattr(quant_method, "process_weights_after_loading"):
            quant_method.process_weights_after_loading(module)


# Faults the stand-in can plant in the attention it computes (verify()'s positive controls: a
# check that cannot tell them from the right attention proves nothing).
FAULTS = ("scale_x1.1", "q_k_swapped")


def stand_in(model: Any, calls: list[Any], peaks: list[Any] | None = None,
             fault: list[str | None] | None = None) -> Any:
    """Replace every encoder layer's MMEncoderAttention by the stand-in (same state, vLLM's own
    computation) that records the slice lengths of the `cu_seqlens` it gets (None: without) and,
    into `peaks` when given, (logit std, median over queries and heads of the largest attention
    probability, 1 / length) of the first packed sequence. `fault[0]`, when set, is one of FAULTS,
    planted in what it computes. Returns what puts vLLM's class back."""
    fault = fault if fault is not None else [None]
    originals = []
    for layer in model.vpm.encoder.layers:
        attn = layer.self_attn.attn
        base = type(attn)

        class StandInPlatformEncoderAttention(base):  # type: ignore[misc, valid-type]
            def forward(self, query: Any, key: Any, value: Any, cu_seqlens: Any = None, *args: Any,
                        **kwargs: Any) -> Any:
                calls.append(None if cu_seqlens is None else (cu_seqlens[1:] - cu_seqlens[:-1]).tolist())
                if peaks is not None and cu_seqlens is not None:
                    peaks.append(attention_peak(query, key, int(cu_seqlens[1]), self.num_heads, self.scale))
                if fault[0] == "q_k_swapped":
                    query, key = key, query
                scale = self.scale
                if fault[0] == "scale_x1.1":
                    self.scale = scale * 1.1
                try:
                    return super().forward(query, key, value, cu_seqlens, *args, **kwargs)
                finally:
                    self.scale = scale

        originals.append((attn, base))
        attn.__class__ = StandInPlatformEncoderAttention

    def restore() -> None:
        for attn, base in originals:
            attn.__class__ = base

    return restore


def attention_peak(query: Any, key: Any, length: int, heads: int, scale: float) -> tuple[float, float, float]:
    """(logit std, median of the largest attention probability per query and head, 1 / length) of
    the first `length` tokens of a packed `(1, tokens, heads x head_dim)` query and key."""
    q = query[0, :length].float().reshape(length, heads, -1).transpose(0, 1)
    k = key[0, :length].float().reshape(length, heads, -1).transpose(0, 1)
    logits = q @ k.transpose(1, 2) * scale
    top = logits.softmax(-1).amax(-1)
    return float(logits.std()), float(top.median()), 1.0 / length


def slices(image_processor: Any, mode: str) -> tuple[Any, Any]:
    """(packed pixel values (1, 3, 14, sum of lengths), target sizes) of IMAGES, one encoder batch."""
    import torch

    parts, sizes = [], []
    for width, height, max_slice_nums, scale_resolution in IMAGES:
        generator = torch.Generator().manual_seed(width)
        image = torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=generator)
        out = image_processor(images=[image], max_slice_nums=max_slice_nums, downsample_mode=mode,
                              scale_resolution=scale_resolution, return_tensors="pt")
        parts.append(out["pixel_values"])
        sizes.append(out["target_sizes"])
    return torch.cat(parts, dim=-1), torch.cat(sizes).to(torch.int64)


def vllm_inputs(pixel_values: Any, target_sizes: Any) -> dict[str, Any]:
    """The same slices as vLLM's batched `pixel_values` (a list of (3, 14, L)) and `tgt_sizes`."""
    patch = pixel_values.shape[-2]
    out, start = [], 0
    for h, w in target_sizes.tolist():
        out.append(pixel_values[0, :, :, start:start + h * w * patch])
        start += h * w * patch
    assert start == pixel_values.shape[-1]
    return {"pixel_values": out, "tgt_sizes": target_sizes}


def max_diff(a: list[Any], b: list[Any]) -> float:
    assert [x.shape for x in a] == [y.shape for y in b]
    return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b))


QUANTILES = (0.5, 0.9, 0.99, 0.999, 1.0)


def ulps(a: list[Any], b: list[Any]) -> list[float]:
    """The distribution of |a - b| in bf16 ulps (the spacing of bf16 numbers, 2**(exponent - 7)) at
    each element of `b`, elements smaller than their output's RMS counted at the RMS (their error
    comes from sums of terms of that size, not from their own rounding): QUANTILES of it."""
    import torch

    diffs = []
    for x, y in zip(a, b):
        y = y.float()
        ulp = torch.exp2(torch.floor(torch.log2(y.abs().clamp_min(float(y.pow(2).mean().sqrt())))) - 7)
        diffs.append(((x.float() - y).abs() / ulp).flatten())
    d = torch.cat(diffs).double()
    return [float(torch.quantile(d, q)) for q in QUANTILES]


def run(module: Any, model_config: Any, checkpoint: pathlib.Path, cls: Any = None,
        modes: tuple[str, ...] = ("16x", "4x"), controls: bool = True) -> dict[str, Any]:
    """Every comparison, per mode, and the positive controls (FAULTS) in the first mode unless not
    `controls`; the patch is applied and taken back here (class attribute)."""
    import torch
    from transformers import AutoProcessor

    from minicpmv_ascend_plugin.patches.model import vit_varlen_attention

    model_cls = module.MiniCPMV4_6ForConditionalGeneration
    original = model_cls.__dict__["get_vision_hidden_states"]
    config = real_dim_config(model_config.hf_config)
    vision, merger = transformers_model(config)
    fp32, bf16 = (vision_model(module, model_config, config, cls=cls) for _ in range(2))
    for model, dtype in ((fp32, torch.float32), (bf16, torch.bfloat16)):
        load_transformers_weights(model, vision, merger)
        finish_loading(model.to(dtype))
    calls: list[Any] = []
    peaks: list[Any] = []
    fault: list[str | None] = [None]
    stand_in(fp32, calls, peaks, fault)
    stand_in(bf16, calls, None, fault)
    image_processor = AutoProcessor.from_pretrained(checkpoint).image_processor
    result: dict[str, Any] = {"class": type(fp32).__name__, "reason": vit_varlen_attention.check(module)}
    try:
        for mode in modes:
            pixel_values, target_sizes = slices(image_processor, mode)
            data = vllm_inputs(pixel_values, target_sizes)
            outputs: dict[str, list[Any]] = {}
            recorded: dict[str, list[Any]] = {}
            with torch.no_grad():
                for patched in (False, True):
                    model_cls.get_vision_hidden_states = original
                    if patched:
                        vit_varlen_attention.apply(module)
                    for name, model in (("fp32", fp32), ("bf16", bf16)):
                        calls.clear()
                        peaks.clear()
                        key = f"{'varlen' if patched else 'masked'}_{name}"
                        outputs[key] = model.get_vision_hidden_states(data, downsample_mode=mode)
                        recorded[key] = list(calls)
                        if patched and name == "fp32":
                            attention_peaks = list(peaks)
                # the positive controls (first mode): the patch's path with a fault planted in the attention
                for planted in FAULTS if controls and mode == modes[0] else ():
                    fault[0] = planted
                    try:
                        for name, model in (("fp32", fp32), ("bf16", bf16)):
                            outputs[f"{planted}_{name}"] = model.get_vision_hidden_states(data, downsample_mode=mode)
                    finally:
                        fault[0] = None
                model_cls.get_vision_hidden_states = original
                # transformers slice by slice: 5.14.1's vit_merger assumes equal slices in a batch
                outputs["transformers_fp32"] = []
                for part, size in zip(data["pixel_values"], target_sizes.split(1)):
                    hidden = vision(part.unsqueeze(0), target_sizes=size, use_vit_merger=mode == "16x")
                    outputs["transformers_fp32"] += merger(hidden.last_hidden_state,
                                                           size // 2 if mode == "16x" else size)
            lengths = [h * w for h, w in target_sizes.tolist()]
            result[mode] = {
                "slice_patches": lengths,
                "tokens": [int(x.shape[0]) for x in outputs["masked_fp32"]],
                "scale": max(float(x.abs().max()) for x in outputs["masked_fp32"]),
                "floor_masked_bf16_vs_fp32": max_diff(outputs["masked_bf16"], outputs["masked_fp32"]),
                "varlen_bf16_vs_masked_bf16": max_diff(outputs["varlen_bf16"], outputs["masked_bf16"]),
                "varlen_bf16_vs_masked_fp32": max_diff(outputs["varlen_bf16"], outputs["masked_fp32"]),
                "varlen_fp32_vs_masked_fp32": max_diff(outputs["varlen_fp32"], outputs["masked_fp32"]),
                "varlen_fp32_vs_transformers": max_diff(outputs["varlen_fp32"], outputs["transformers_fp32"]),
                "masked_fp32_vs_transformers": max_diff(outputs["masked_fp32"], outputs["transformers_fp32"]),
                "varlen_bf16_vs_masked_bf16_ulps": ulps(outputs["varlen_bf16"], outputs["masked_bf16"]),
                "floor_masked_bf16_vs_fp32_ulps": ulps(outputs["masked_bf16"], outputs["masked_fp32"]),
                "attention_peaks": attention_peaks,
                "controls": {planted: {
                    "bf16_vs_masked_bf16": max_diff(outputs[f"{planted}_bf16"], outputs["masked_bf16"]),
                    "bf16_vs_masked_bf16_ulps": ulps(outputs[f"{planted}_bf16"], outputs["masked_bf16"]),
                    "fp32_vs_masked_fp32": max_diff(outputs[f"{planted}_fp32"], outputs["masked_fp32"]),
                } for planted in FAULTS if f"{planted}_bf16" in outputs},
                "calls": recorded,
            }
    finally:
        model_cls.get_vision_hidden_states = original
    return result


def expected_calls(lengths: list[int], mode: str) -> list[list[int]]:
    """What the stand-in must record with the patch: the slices' patch counts for each layer up to
    the vit_merger, a quarter of them after it (16x); the full counts in every layer (4x)."""
    if mode == "4x":
        return [lengths] * LAYERS
    return [lengths] * (INSERT_LAYER_ID + 1) + [[n // 4 for n in lengths]] * (LAYERS - INSERT_LAYER_ID - 1)


# The bf16 bound in output ulps (`ulps()`: quantile -> most ulps). A correct packed attention
# differs from the masked one in summation order only: measured on 0.30 (2 layers, the 8 slices of
# IMAGES) at median 0, 90th percentile 0.5-0.72, 99th 2, 99.9th 2.5-3, max 3.0-3.3 ulps (16x, 4x);
# the masked path's own bf16-vs-fp32 difference is 1.0-1.5 / 2.6-4.4 / 4.9-7.2 / 7.0-9.5 /
# 9.4-12.1. Twice the measured spread, so a kernel whose rounding differs by a few ulps passes,
# while the positive controls fail it by far (scale x1.1: median 11, 99th 56 ulps; q and k
# swapped: median 94).
BF16_ULPS = {0.99: 4.0, 1.0: 8.0}


def within_bf16_bound(quantiles: list[float]) -> bool:
    measured = dict(zip(QUANTILES, quantiles))
    return all(measured[q] <= most for q, most in BF16_ULPS.items())


def verify(result: dict[str, Any], modes: tuple[str, ...] = ("16x", "4x"), controls: bool = True) -> None:
    """The claims, on one model class's `run()` result:
    - without the patch the platform's encoder attention never runs for these slices (the stand-in
      records nothing: vLLM's masked SDPA); with it, once per layer with the expected `cu_seqlens`;
    - the tower's attention is peaked (layer 0: logit std 1-3, the median largest probability at
      least 10x uniform), so an error in the attention weights shows in the output;
    - the patch in bf16 differs from the masked path in bf16 within BF16_ULPS, and by no more than
      the masked path's own bf16-vs-fp32 difference (the noise floor, docs/design/accuracy.md);
    - in fp32 it equals the masked path and transformers' 4.6 vision forward to within 1 % of
      that floor (summation order only);
    - positive controls: the same path with the attention's scale off by 10 % or q and k swapped
      fails both bounds (required unless not `controls`)."""
    assert result["reason"] is None, result["reason"]
    controlled = False
    for mode in modes:
        r = result[mode]
        lengths = r["slice_patches"]
        assert len(set(lengths)) > 1, "the slices must differ in length (vLLM's masked path)"
        assert r["tokens"] == [n // (16 if mode == "16x" else 4) for n in lengths]
        assert r["calls"]["masked_fp32"] == r["calls"]["masked_bf16"] == [], r["calls"]
        assert r["calls"]["varlen_fp32"] == r["calls"]["varlen_bf16"] == expected_calls(lengths, mode), r["calls"]
        logit_std, top, uniform = r["attention_peaks"][0]
        assert 1 <= logit_std <= 3 and top >= 10 * uniform, r["attention_peaks"]
        floor = r["floor_masked_bf16_vs_fp32"]
        assert 0 < floor < 0.05 * r["scale"], r
        assert within_bf16_bound(r["varlen_bf16_vs_masked_bf16_ulps"]), r
        assert r["varlen_bf16_vs_masked_bf16"] <= floor, r
        assert r["varlen_fp32_vs_masked_fp32"] <= floor / 100, r
        assert r["varlen_fp32_vs_transformers"] <= floor / 100, r
        assert r["masked_fp32_vs_transformers"] <= floor / 100, r
        for planted, control in r["controls"].items():
            assert not within_bf16_bound(control["bf16_vs_masked_bf16_ulps"]), (planted, control)
            assert control["bf16_vs_masked_bf16"] > floor, (planted, control)
            assert control["fp32_vs_masked_fp32"] > floor / 100, (planted, control)
        controlled |= set(r["controls"]) == set(FAULTS)
    assert controlled or not controls, "no positive control ran"


def bench(module: Any, model_config: Any, checkpoint: pathlib.Path, sizes: list[tuple[int, int]],
          modes: tuple[str, ...], pairs: int, threads: int | None) -> list[dict[str, Any]]:
    """Encoder milliseconds per image of the FULL-SIZE tower (27 layers, the last dropped, the
    vit_merger after layer 6; random weights, bf16), patch off / on in alternating pairs: what
    `get_vision_hidden_states` costs for one image's slices (transformers' processor, default
    `max_slice_nums`)."""
    import time

    import torch
    from transformers import AutoProcessor

    from minicpmv_ascend_plugin.patches.model import vit_varlen_attention

    if threads:
        torch.set_num_threads(threads)
    config = copy.deepcopy(model_config.hf_config)
    vision = config.vision_config
    vision.hidden_size, vision.num_attention_heads, vision.intermediate_size = HIDDEN, HEADS, INTERMEDIATE
    vision.num_hidden_layers, config.drop_vision_last_layer = 27, True
    vision.insert_layer_id = config.insert_layer_id = 6
    model = vision_model(module, model_config, config)
    finish_loading(model.to(torch.bfloat16))
    model_cls = module.MiniCPMV4_6ForConditionalGeneration
    original = model_cls.__dict__["get_vision_hidden_states"]
    image_processor = AutoProcessor.from_pretrained(checkpoint).image_processor
    rows = []
    try:
        for width, height in sizes:
            for mode in modes:
                image = torch.randint(0, 256, (3, height, width), dtype=torch.uint8,
                                      generator=torch.Generator().manual_seed(0))
                out = image_processor(images=[image], downsample_mode=mode, return_tensors="pt")
                data = vllm_inputs(out["pixel_values"], out["target_sizes"].to(torch.int64))
                times: dict[str, list[float]] = {"off": [], "on": []}
                with torch.no_grad():
                    for _ in range(pairs + 1):  # the first pair warms up and is dropped
                        for arm in ("off", "on"):
                            model_cls.get_vision_hidden_states = original
                            if arm == "on":
                                vit_varlen_attention.apply(module)
                            started = time.perf_counter()
                            model.get_vision_hidden_states(data, downsample_mode=mode)
                            times[arm].append((time.perf_counter() - started) * 1000)
                on, off = times["on"][1:], times["off"][1:]
                rows.append({"size": f"{width}x{height}", "mode": mode,
                             "slice_patches": [h * w for h, w in out["target_sizes"].tolist()],
                             "off_ms": off, "on_ms": on, "ratios_on_off": [a / b for a, b in zip(on, off)],
                             "load_1min": os.getloadavg()[0]})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        model_cls.get_vision_hidden_states = original
    return rows


def main(argv: list[str]) -> None:
    """On the installed vLLM (0.32: also MiniCPM-V 4.7's class, which inherits the method); with
    `--bench`, the full-size encoder timings instead."""
    import argparse

    os.environ["VLLM_PLUGINS"] = ""  # the patch is applied by run(), not by the plugin's loader
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--bench", action="store_true", help="full-size encoder ms per image, patch off/on pairs")
    parser.add_argument("--sizes", default="1084x820,1344x1008", help="WIDTHxHEIGHT,... (--bench)")
    parser.add_argument("--modes", default="16x,4x", help="downsample modes (--bench)")
    parser.add_argument("--pairs", type=int, default=3, help="off/on pairs after one warm-up pair (--bench)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (--bench; default torch's)")
    args = parser.parse_args(argv)
    import vllm.model_executor.models.minicpmv4_6 as module
    from vllm.config import ModelConfig

    checkpoint = args.checkpoint
    model_config = ModelConfig(model=checkpoint, tokenizer=checkpoint, dtype="bfloat16", max_model_len=4096)
    if args.bench:
        sizes = [tuple(int(v) for v in size.split("x")) for size in args.sizes.split(",")]
        rows = bench(module, model_config, pathlib.Path(checkpoint), sizes,  # type: ignore[arg-type]
                     tuple(args.modes.split(",")), args.pairs, args.threads)
        print("RESULT " + json.dumps(rows))
        return
    results = {"4.6": run(module, model_config, pathlib.Path(checkpoint))}
    try:
        from vllm.model_executor.models import minicpmv4_7
    except ImportError:
        minicpmv4_7 = None
    if minicpmv4_7 is not None:
        cls = minicpmv4_7.MiniCPMV4_7ForConditionalGeneration
        # the positive controls test the check, not the class: 4.6's run has them
        results["4.7"] = run(module, model_config, pathlib.Path(checkpoint), cls=cls, modes=("16x",), controls=False)
        results["4.7"]["inherits"] = "get_vision_hidden_states" not in vars(cls)
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1:])
