"""Each vLLM-side bug happening with the target's own code, and gone with the plugin's patch; or,
where the target already has the fix, its own code doing the right thing and the predicate saying so.

"Placeholders" are the embedding slots vLLM reserves in the prompt; the engine fills them with the
vision encoder's output and fails when the two counts differ (`_merge_multimodal_embeddings`).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from _target import IMAGE_PAD, VIDEO_PAD, hf_image_ids, hf_processor, placeholder_lengths


def image(width: int, height: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=generator)


def check_predicate(vllm_code, target, name: str) -> None:
    """The patch's predicate, reading the target's own module, says what the target needs."""
    import minicpmv_ascend_plugin as plugin

    patch = next(p for p in plugin.PATCHES if p.name == name)
    reason = patch.check(vllm_code.module)
    assert (reason is None) == target.needs(name), (target.vllm, name, reason)


def test_processor_version_crash_without_and_hf_processor_with_the_patch(vllm_code, target):
    """0.23: a crash on the first image and in the profiling dummy inputs (no server start); the
    patch returns transformers' own processor, which vLLM >= 0.24 does itself."""
    from transformers import MiniCPMV4_6Processor
    from vllm.multimodal import MULTIMODAL_REGISTRY

    check_predicate(vllm_code, target, "processor-version")
    info = vllm_code.processor.info
    if target.needs("processor-version"):
        with pytest.raises(AttributeError, match="has no attribute 'version'"):
            info.get_hf_processor()
        with pytest.raises(AttributeError, match="has no attribute 'version'"):
            MULTIMODAL_REGISTRY.get_dummy_mm_inputs(vllm_code.model_config, {"image": 1},
                                                    processor=vllm_code.processor)
        vllm_code.apply("processor-version")
    assert isinstance(info.get_hf_processor(), MiniCPMV4_6Processor)
    dummy = MULTIMODAL_REGISTRY.get_dummy_mm_inputs(vllm_code.model_config, {"image": 1},
                                                    processor=vllm_code.processor)
    assert placeholder_lengths(dummy, "image")[0] > 0


def test_image_size_order_1084x820(vllm_code, target, checkpoint):
    """1084x820: 441 vision embeddings; vLLM 0.23 reserves 495 placeholders. Shown end to end:
    processed by vLLM, encoded by vLLM's vision tower, compared with transformers' processor."""
    from minicpmv_ascend_plugin.patches.model.image_size_order import Plan, plan

    check_predicate(vllm_code, target, "image-size-order")
    # Decided by calling this vLLM's own methods, not by the release-number fallback.
    assert plan(vllm_code.module).how == "probe"
    reference = hf_image_ids(hf_processor(checkpoint), 1084, 820)
    expected = reference.count(vllm_code.image_pad_id)
    assert expected == 441

    vllm_code.apply(*target.processing_fixes("image-size-order"))
    out = vllm_code.process(IMAGE_PAD, images=[image(1084, 820)])
    (embeddings,) = vllm_code.embed([("image", out)])
    assert embeddings.shape[0] == expected  # the encoder (pixels in the right order) makes 441
    if target.needs("image-size-order"):
        assert placeholder_lengths(out, "image") == [495]  # the bug: 54 slots the engine cannot fill
        vllm_code.apply(*target.processing_fixes())
        out = vllm_code.process(IMAGE_PAD, images=[image(1084, 820)])
        (embeddings,) = vllm_code.embed([("image", out)])
    else:
        # Applied where it is not needed, 0.23's fix would break this vLLM: the same 495.
        vllm_code.apply(*target.processing_fixes(), "image-size-order",
                        plan=Plan(swap_size=True, columns_first=True, how="test"))
        assert placeholder_lengths(vllm_code.process(IMAGE_PAD, images=[image(1084, 820)]), "image") == [495]
        vllm_code.apply(*target.processing_fixes())
    assert placeholder_lengths(out, "image") == [embeddings.shape[0]] == [expected]
    assert out["prompt_token_ids"] == reference  # the same token sequence as transformers


def test_slice_layout_is_transformers(vllm_code, target, checkpoint):
    """The trap: 0.23 swaps width/height in the size AND rows/columns in the slice layout. Fixing
    only the size (what vLLM 0.24.0 did) fixes the count but transposes the newline layout; vLLM
    >= 0.25 has both, and its own layout is transformers'."""
    from minicpmv_ascend_plugin.patches.model.image_size_order import Plan

    reference = hf_image_ids(hf_processor(checkpoint), 1084, 820)
    if target.needs("image-size-order"):
        vllm_code.apply(*target.processing_fixes(), plan=Plan(swap_size=True, columns_first=False, how="test"))
        size_only = vllm_code.placeholder_ids(1084, 820)
        assert size_only.count(vllm_code.image_pad_id) == reference.count(vllm_code.image_pad_id)
        assert size_only != reference
    else:
        # Only the layout half applied where it is not needed: the same transposed layout.
        vllm_code.apply(*target.processing_fixes(), "image-size-order",
                        plan=Plan(swap_size=False, columns_first=True, how="test"))
        assert vllm_code.placeholder_ids(1084, 820) != reference
    vllm_code.apply(*target.processing_fixes())
    assert vllm_code.placeholder_ids(1084, 820) == reference


def test_per_request_max_slice_nums(vllm_code, target, checkpoint):
    """max_slice_nums=2 cuts 1084x820 into 2 slices (183 embeddings); without the fix vLLM
    reserves the default limit's 441 placeholders."""
    check_predicate(vllm_code, target, "max-slice-nums")
    reference = hf_image_ids(hf_processor(checkpoint), 1084, 820, max_slice_nums=2)
    assert reference.count(vllm_code.image_pad_id) == 183

    vllm_code.apply(*target.processing_fixes("max-slice-nums"))
    out = vllm_code.process(IMAGE_PAD, images=[image(1084, 820)], max_slice_nums=2)
    (embeddings,) = vllm_code.embed([("image", out)])
    assert embeddings.shape[0] == 183
    assert placeholder_lengths(out, "image") == [441 if target.needs("max-slice-nums") else 183]

    vllm_code.apply(*target.processing_fixes())
    out = vllm_code.process(IMAGE_PAD, images=[image(1084, 820)], max_slice_nums=2)
    (embeddings,) = vllm_code.embed([("image", out)])
    assert placeholder_lengths(out, "image") == [embeddings.shape[0]] == [183]
    assert out["prompt_token_ids"] == reference
    # A request without the option keeps the processor default.
    out = vllm_code.process(IMAGE_PAD, images=[image(1084, 820)])
    assert placeholder_lengths(out, "image") == [441]


def test_mixed_4x_16x_encoder_batch(vllm_code, target):
    """Two requests, one 16x and one 4x image, encoded in one batch (as the model runner does)."""
    check_predicate(vllm_code, target, "vit-merger-flags")
    vllm_code.apply(*target.processing_fixes())
    a = vllm_code.process(IMAGE_PAD, images=[image(640, 480, seed=1)], downsample_mode="16x")
    b = vllm_code.process(IMAGE_PAD, images=[image(500, 700, seed=2)], downsample_mode="4x")
    slots = placeholder_lengths(a, "image") + placeholder_lengths(b, "image")
    assert slots[1] > slots[0]

    batched = [e.shape[0] for e in vllm_code.embed([("image", a), ("image", b)])]
    if target.needs("vit-merger-flags"):
        assert batched[1] != slots[1]  # the bug: any() encodes the 4x image in 16x mode
        vllm_code.apply(*target.processing_fixes(), "vit-merger-flags")
        a = vllm_code.process(IMAGE_PAD, images=[image(640, 480, seed=1)], downsample_mode="16x")
        b = vllm_code.process(IMAGE_PAD, images=[image(500, 700, seed=2)], downsample_mode="4x")
    batched = vllm_code.embed([("image", a), ("image", b)])
    assert [e.shape[0] for e in batched] == slots
    # Batch-invariant: each item is what it would be if encoded alone.
    for together, out in zip(batched, (a, b)):
        (alone,) = vllm_code.embed([("image", out)])
        torch.testing.assert_close(together, alone)


def test_video_follows_its_own_4x_mode(vllm_code, target):
    """A 4x video: without the fix videos get no merger flag and are encoded in the config's 16x."""
    video = np.random.default_rng(0).integers(0, 256, (2, 300, 500, 3), dtype=np.uint8)
    vllm_code.apply(*target.processing_fixes())
    out = vllm_code.process(VIDEO_PAD, videos=[video], downsample_mode="4x")
    slots = placeholder_lengths(out, "video")
    (embeddings,) = vllm_code.embed([("video", out)])
    if target.needs("vit-merger-flags"):
        assert embeddings.shape[0] * 4 == slots[0]  # 16x: a quarter of the 4x placeholders
        vllm_code.apply(*target.processing_fixes(), "vit-merger-flags")
        out = vllm_code.process(VIDEO_PAD, videos=[video], downsample_mode="4x")
        (embeddings,) = vllm_code.embed([("video", out)])
    assert [embeddings.shape[0]] == placeholder_lengths(out, "video") == slots
    out16 = vllm_code.process(VIDEO_PAD, videos=[video])
    (embeddings16,) = vllm_code.embed([("video", out16)])
    assert [embeddings16.shape[0]] == placeholder_lengths(out16, "video") == [slots[0] // 4]
