"""`vit-varlen-attention` on the target's own vLLM code: MiniCPM-V 4.6's sliced images reach vLLM's
`MMEncoderAttention` with `cu_seqlens` (so a platform's implementation, vllm-ascend's fused one,
runs) instead of the padded masked SDPA, with the same numbers.

- at the real attention shape (hidden 1152, 16 heads), 16x and 4x: vit_varlen_check.py (the
  noise-floor bound, transformers' 4.6 vision forward, a stand-in for a platform's
  `MMEncoderAttention` recording `cu_seqlens`);
- on the tiny checkpoint, requests processed by the target's own processor and encoded in one
  batch as the model runner does (a sliced 16x image, a 4x image, a 4x and a 16x video): composed
  with `vit-merger-flags`, equal to the masked path.
"""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import torch

import vit_varlen_check as check
from _target import IMAGE_PAD, VIDEO_PAD, placeholder_lengths, run_python, vision_model

NAME = "vit-varlen-attention"


def image(width: int, height: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=generator)


def test_predicate_reads_the_targets_code(vllm_code, target):
    """The predicate, reading the target's module, says what the target needs; the encoder layer it
    mirrors is the target's (a changed layer would leave the patch unapplied, with the reason)."""
    from vllm.model_executor.models.idefics2_vision_model import Idefics2EncoderLayer

    import minicpmv_ascend_plugin as plugin
    from minicpmv_ascend_plugin.patches.model import vit_varlen_attention

    patch = next(p for p in plugin.PATCHES if p.name == NAME)
    assert (patch.check(vllm_code.module) is None) == target.needs(NAME)
    assert vit_varlen_attention.body_statements(Idefics2EncoderLayer.forward) == vit_varlen_attention.LAYER_STATEMENTS


SWITCH_PROBE = textwrap.dedent("""
    import json
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    import vllm.model_executor.models.minicpmv4_6 as m
    import minicpmv_ascend_plugin as plugin
    print("RESULT " + json.dumps({
        "decisions": {k: [v.status, v.reason] for k, v in plugin.decisions().items()},
        "wrapped": hasattr(m.MiniCPMV4_6ForConditionalGeneration.get_vision_hidden_states, "__wrapped__")}))
""")


def test_switch_turns_only_this_patch_off(target, monkeypatch):
    """`MINICPMV_ASCEND_PLUGIN=off:vit-varlen-attention`, loaded by the target's vLLM: this patch
    skipped (vLLM's own method in place), every other decision as usual; a name that is no patch
    stops vLLM's plugin loading with the list of names."""
    import minicpmv_ascend_plugin as plugin
    from minicpmv_ascend_plugin.core import registry

    proc = run_python(SWITCH_PROBE, env={"MINICPMV_ASCEND_PLUGIN": f"off:{NAME}"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT ")).removeprefix("RESULT "))
    assert out["decisions"][NAME] == ["skipped", f"switched off by MINICPMV_ASCEND_PLUGIN=off:{NAME}"]
    assert not out["wrapped"]
    applied = {name for name, (status, _) in out["decisions"].items() if status == "applied"}
    assert applied == {p.name for p in plugin.PATCHES if target.needs(p.name)} - {NAME}
    monkeypatch.setenv("MINICPMV_ASCEND_PLUGIN", "off:vit-varlen-atention")
    assert plugin.switched_off() == {"vit-varlen-atention"} and not plugin.disabled()
    registered = registry._registered
    registry._registered = False
    try:
        with pytest.raises(RuntimeError, match="names no patch of this plugin: vit-varlen-atention; the patches are"):
            plugin.register()
    finally:
        registry._registered = registered


def test_real_head_dim_within_the_noise_floor_and_equal_to_transformers(vllm_code, target, checkpoint):
    """A 1260x480 image's 3 slices (192, 240, 240 patches) at hidden 1152 / 16 heads, 2 layers:
    without the patch the stand-in platform attention is never called (masked SDPA); with it, it
    is called per layer with the slices' cu_seqlens, within the bf16 noise floor of the masked path,
    and equal to transformers in fp32."""
    vllm_code.restore()
    result = check.run(vllm_code.module, vllm_code.model_config, checkpoint)
    check.verify(result)


def device_recorder(model, seen: list) -> None:
    """Every encoder layer's MMEncoderAttention made a STAND-IN for vllm-ascend's
    `AscendMMEncoderAttention` (not importable off an NPU): it records the device of the query, of
    `cu_seqlens` and of `max_seqlen` it is given, and the host values of `cu_seqlens` when it is on
    the host, then computes with vLLM's own code."""
    for layer in model.vpm.encoder.layers:
        base = type(layer.self_attn.attn)

        class StandInAscendMMEncoderAttention(base):  # type: ignore[misc, valid-type]
            def forward(self, query, key, value, cu_seqlens=None, max_seqlen=None, *args, **kwargs):
                seen.append((query.device.type, cu_seqlens.device.type, max_seqlen.device.type,
                             cu_seqlens.tolist() if cu_seqlens.device.type == "cpu" else None,
                             int(max_seqlen) if max_seqlen.device.type == "cpu" else None))
                return super().forward(query, key, value, cu_seqlens, max_seqlen, *args, **kwargs)

        layer.self_attn.attn.__class__ = StandInAscendMMEncoderAttention


@pytest.mark.parametrize("platform", ["npu", "cuda"])
def test_seqlens_on_the_host_on_ascend_only(vllm_code, target, monkeypatch, platform):
    """On the Ascend platform the attention gets `cu_seqlens` and `max_seqlen` as host tensors
    (vllm-ascend reads them on the host in every layer: a device tensor would cost a device-to-host
    copy and sync per layer); elsewhere on the model's device (CUDA's varlen kernels read them
    there). The tower (real attention shape, 2 layers) runs on torch's "meta" device, a fake device
    that is not the host, so the test tells host from device; 4x (vLLM's `vit_merger` does not run
    on "meta"; after it, `cu_seqlens` comes from the same `seqlens()`)."""
    from minicpmv_ascend_plugin.patches.model import vit_varlen_attention

    monkeypatch.setattr(vit_varlen_attention, "platform_name", lambda: platform)
    config = check.real_dim_config(vllm_code.model_config.hf_config)
    model = vision_model(vllm_code.module, vllm_code.model_config, config).to("meta")
    seen: list = []
    device_recorder(model, seen)
    sizes = torch.tensor([[8, 24], [12, 20], [12, 20]])
    lengths = [h * w for h, w in sizes.tolist()]
    hidden = torch.empty(sum(lengths), check.HIDDEN, device="meta")
    out = vit_varlen_attention.encode(model, hidden, lengths, sizes, "4x")
    assert [o.shape[0] for o in out] == [n // 4 for n in lengths]
    if platform == "npu":
        assert seen == [("meta", "cpu", "cpu", [0, 192, 432, 672], 240)] * check.LAYERS
    else:
        assert seen == [("meta", "meta", "meta", None, None)] * check.LAYERS


def test_patch_embedding_is_already_one_matmul(vllm_code, target):
    """A patch embedding as one matmul over the unfolded patches (instead of a convolution) is what
    the target's vLLM already runs on Ascend, so no patch does it: 4.6's `patch_embedding` is vLLM's
    `Conv2dLayer` (kernel = stride = 14, no padding: `enable_linear`), whose `forward_native` is
    `_forward_mulmat` (unfold, one `F.linear`); `Conv2dLayer` does not override `forward_oot`,
    which for an out-of-tree platform calls `forward_native`, and vllm-ascend registers an op of
    its own for `Conv3dLayer` only (v0.23.0, main). At the real width (3 x 14 x 14 -> 1152), fp32,
    two slices of 240 patches: that path equals the convolution to 2e-6 of the output's largest
    magnitude (a 588-term dot product in another order)."""
    import torch.nn.functional as F
    from vllm.model_executor.custom_op import CustomOp
    from vllm.model_executor.layers.conv import Conv2dLayer

    config = check.real_dim_config(vllm_code.model_config.hf_config)
    layer = vision_model(vllm_code.module, vllm_code.model_config, config).vpm.embeddings.patch_embedding
    assert type(layer) is Conv2dLayer and layer.enable_linear
    assert Conv2dLayer.forward_oot is CustomOp.forward_oot
    # pixel values as the processor makes them: normalized with mean 0.5 and std 0.5, in [-1, 1]
    pixels = torch.rand(2, 3, 14, 14 * 240, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        matmul = layer.forward_oot(pixels)
        conv = F.conv2d(pixels, layer.weight, layer.bias, stride=14)
    assert matmul.shape == conv.shape == (2, check.HIDDEN, 1, 240)
    # summation order only: measured 3.7e-6 on outputs up to 3.3 (0.30), 1.1e-6 of the largest
    assert float((matmul - conv).abs().max()) <= 2e-6 * float(conv.abs().max())


def test_equal_slices_keep_vllms_path(vllm_code, target, checkpoint):
    """A batch whose slices all have one length (a 480x640 image in 3 slices of 240 patches) is
    vLLM's own path with the patch applied: vLLM masks nothing there and calls MMEncoderAttention
    without `cu_seqlens` (so vllm-ascend's fused kernel already runs); the output is vLLM's, bit
    for bit."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(checkpoint).image_processor
    out = processor(images=[image(480, 640)], max_slice_nums=3, downsample_mode="16x", scale_resolution=224,
                    return_tensors="pt")
    data = check.vllm_inputs(out["pixel_values"], out["target_sizes"].to(torch.int64))
    assert [h * w for h, w in data["tgt_sizes"].tolist()] == [240, 240, 240]
    model = vllm_code.model()
    calls: list = []
    restore = check.stand_in(model, calls)
    try:
        with torch.no_grad():
            own = model.get_vision_hidden_states(data, downsample_mode="16x")
            own_calls = list(calls)
            vllm_code.apply(NAME)
            calls.clear()
            patched = model.get_vision_hidden_states(data, downsample_mode="16x")
    finally:
        restore()
    assert own_calls == calls == [None] * len(model.vpm.encoder.layers)
    for a, b in zip(patched, own):
        assert torch.equal(a, b)


def test_processed_requests_compose_with_vit_merger_flags(vllm_code, target):
    """One encoder batch of real processed requests, as the plugin patches the target: the varlen
    path gives the masked path's embeddings (fp32), in each item's own 4x/16x mode, and the
    stand-in attention sees the slices packed in the group whose slices differ in length, and
    vLLM's own call (no `cu_seqlens`) in the groups of one length."""
    fixes = (*target.processing_fixes(), "vit-merger-flags")
    vllm_code.apply(*fixes)
    video = np.random.default_rng(0).integers(0, 256, (2, 300, 500, 3), dtype=np.uint8)
    requests = [
        ("image", vllm_code.process(IMAGE_PAD, images=[image(1084, 820, seed=1)], downsample_mode="16x")),
        ("image", vllm_code.process(IMAGE_PAD, images=[image(500, 700, seed=2)], downsample_mode="4x")),
        ("video", vllm_code.process(VIDEO_PAD, videos=[video], downsample_mode="4x")),
        ("video", vllm_code.process(VIDEO_PAD, videos=[video])),
    ]
    slots = [n for modality, out in requests for n in placeholder_lengths(out, modality)]
    model = vllm_code.model()
    calls: list = []
    restore = check.stand_in(model, calls)
    try:
        masked = vllm_code.embed(requests)
        masked_calls = list(calls)
        vllm_code.apply(*fixes, NAME)
        calls.clear()
        varlen = vllm_code.embed(requests)
    finally:
        restore()
    assert [e.shape[0] for e in masked] == [e.shape[0] for e in varlen] == slots
    for a, b in zip(varlen, masked):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    # Masked path: the 500x700 image's slices (1008, 1120, 1120 patches) never reach
    # MMEncoderAttention; batches of one length do, without cu_seqlens: the 1084x820 image (7 slices
    # of 1008) and the uniform video frames. Varlen: every layer of the 500x700 group gets them; the
    # groups of one length keep vLLM's path, without.
    layers = len(model.vpm.encoder.layers)
    assert len(masked_calls) == 3 * layers and all(c is None for c in masked_calls)
    groups = [calls[i:i + layers] for i in range(0, len(calls), layers)]
    assert len(groups) * layers == len(calls) and len(groups) == 4  # image 16x, image 4x, video 4x, video 16x
    kinds = [None if all(c is None for c in g) else len({n for n in g[0]}) > 1 for g in groups]
    assert kinds == [None, True, None, None], groups
    assert masked_calls[layers:] == calls[2 * layers:] and masked_calls[:layers] == calls[:layers]
