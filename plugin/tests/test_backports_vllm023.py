"""Each vLLM-side bug happening with vLLM 0.23.0's own code, and gone with the plugin's patch.

"Placeholders" are the embedding slots vLLM reserves in the prompt; the engine fills them with the
vision encoder's output and fails when the two counts differ (`_merge_multimodal_embeddings`).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from _vllm023 import IMAGE_PAD, VIDEO_PAD, hf_image_ids, hf_processor, placeholder_lengths

VERSION_FIX = "processor-version"  # without it no image can be processed at all on 0.23


def image(width: int, height: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=generator)


def test_processor_version_crash_and_fix(vllm023):
    from transformers import MiniCPMV4_6Processor
    from vllm.multimodal import MULTIMODAL_REGISTRY

    info = vllm023.processor.info
    with pytest.raises(AttributeError, match="has no attribute 'version'"):
        info.get_hf_processor()
    # The same crash kills the dummy inputs vLLM builds to profile memory: no server start.
    with pytest.raises(AttributeError, match="has no attribute 'version'"):
        MULTIMODAL_REGISTRY.get_dummy_mm_inputs(vllm023.model_config, {"image": 1},
                                                processor=vllm023.processor)

    vllm023.apply(VERSION_FIX)
    assert isinstance(info.get_hf_processor(), MiniCPMV4_6Processor)
    dummy = MULTIMODAL_REGISTRY.get_dummy_mm_inputs(vllm023.model_config, {"image": 1},
                                                    processor=vllm023.processor)
    assert placeholder_lengths(dummy, "image")[0] > 0


def test_image_size_order_1084x820(vllm023, checkpoint):
    """1084x820: 441 vision embeddings; vLLM 0.23 reserves 495 placeholders. Shown end to end:
    processed by vLLM, encoded by vLLM's vision tower, compared with transformers' processor."""
    reference = hf_image_ids(hf_processor(checkpoint), 1084, 820)
    expected = reference.count(vllm023.image_pad_id)
    assert expected == 441

    vllm023.apply(VERSION_FIX)
    out = vllm023.process(IMAGE_PAD, images=[image(1084, 820)])
    (embeddings,) = vllm023.embed([("image", out)])
    assert embeddings.shape[0] == expected  # the encoder (pixels in the right order) makes 441
    assert placeholder_lengths(out, "image") == [495]  # the bug: 54 slots the engine cannot fill

    vllm023.apply(VERSION_FIX, "image-size-order")
    out = vllm023.process(IMAGE_PAD, images=[image(1084, 820)])
    (embeddings,) = vllm023.embed([("image", out)])
    assert placeholder_lengths(out, "image") == [embeddings.shape[0]] == [expected]
    assert out["prompt_token_ids"] == reference  # the same token sequence as transformers


def test_size_order_alone_breaks_the_layout(vllm023, checkpoint):
    """The trap: 0.23 swaps width/height in the size AND rows/columns in the slice layout. Fixing
    only the size (what vLLM 0.24.0 did) fixes the count but transposes the newline layout."""
    from minicpmv_ascend_plugin.image_size_order import Plan

    reference = hf_image_ids(hf_processor(checkpoint), 1084, 820)
    vllm023.apply(VERSION_FIX, "image-size-order", plan=Plan(swap_size=True, columns_first=False, how="test"))
    size_only = vllm023.encode([vllm023.image_placeholder(1084, 820)])[0]
    assert size_only.count(vllm023.image_pad_id) == reference.count(vllm023.image_pad_id)
    assert size_only != reference
    vllm023.apply(VERSION_FIX, "image-size-order")
    assert vllm023.encode([vllm023.image_placeholder(1084, 820)])[0] == reference


def test_per_request_max_slice_nums(vllm023, checkpoint):
    """max_slice_nums=2 cuts 1084x820 into 2 slices (183 embeddings); 0.23 reserves 441."""
    reference = hf_image_ids(hf_processor(checkpoint), 1084, 820, max_slice_nums=2)
    assert reference.count(vllm023.image_pad_id) == 183

    vllm023.apply(VERSION_FIX, "image-size-order")
    out = vllm023.process(IMAGE_PAD, images=[image(1084, 820)], max_slice_nums=2)
    (embeddings,) = vllm023.embed([("image", out)])
    assert embeddings.shape[0] == 183
    assert placeholder_lengths(out, "image") == [441]

    vllm023.apply(VERSION_FIX, "image-size-order", "max-slice-nums")
    out = vllm023.process(IMAGE_PAD, images=[image(1084, 820)], max_slice_nums=2)
    (embeddings,) = vllm023.embed([("image", out)])
    assert placeholder_lengths(out, "image") == [embeddings.shape[0]] == [183]
    assert out["prompt_token_ids"] == reference
    # A request without the option keeps the processor default.
    out = vllm023.process(IMAGE_PAD, images=[image(1084, 820)])
    assert placeholder_lengths(out, "image") == [441]


def test_mixed_4x_16x_encoder_batch(vllm023):
    """Two requests, one 16x and one 4x image, encoded in one batch (as the model runner does)."""
    processing = (VERSION_FIX, "image-size-order", "max-slice-nums")
    vllm023.apply(*processing)
    a = vllm023.process(IMAGE_PAD, images=[image(640, 480, seed=1)], downsample_mode="16x")
    b = vllm023.process(IMAGE_PAD, images=[image(500, 700, seed=2)], downsample_mode="4x")
    slots = placeholder_lengths(a, "image") + placeholder_lengths(b, "image")
    assert slots[1] > slots[0]

    batched = [e.shape[0] for e in vllm023.embed([("image", a), ("image", b)])]
    assert batched[1] != slots[1]  # the bug: any() encodes the 4x image in 16x mode

    vllm023.apply(*processing, "vit-merger-flags")
    a = vllm023.process(IMAGE_PAD, images=[image(640, 480, seed=1)], downsample_mode="16x")
    b = vllm023.process(IMAGE_PAD, images=[image(500, 700, seed=2)], downsample_mode="4x")
    batched = vllm023.embed([("image", a), ("image", b)])
    assert [e.shape[0] for e in batched] == slots
    # Batch-invariant: each item is what it would be if encoded alone.
    for together, out in zip(batched, (a, b)):
        (alone,) = vllm023.embed([("image", out)])
        torch.testing.assert_close(together, alone)


def test_video_follows_its_own_4x_mode(vllm023):
    """A 4x video: 0.23 gives videos no merger flag and encodes them in the config's 16x mode."""
    video = np.random.default_rng(0).integers(0, 256, (2, 300, 500, 3), dtype=np.uint8)
    processing = (VERSION_FIX, "image-size-order", "max-slice-nums")
    vllm023.apply(*processing)
    out = vllm023.process(VIDEO_PAD, videos=[video], downsample_mode="4x")
    slots = placeholder_lengths(out, "video")
    (embeddings,) = vllm023.embed([("video", out)])
    assert embeddings.shape[0] * 4 == slots[0]  # 16x: a quarter of the 4x placeholders

    vllm023.apply(*processing, "vit-merger-flags")
    out = vllm023.process(VIDEO_PAD, videos=[video], downsample_mode="4x")
    (embeddings,) = vllm023.embed([("video", out)])
    assert [embeddings.shape[0]] == placeholder_lengths(out, "video") == slots
    out16 = vllm023.process(VIDEO_PAD, videos=[video])
    (embeddings16,) = vllm023.embed([("video", out16)])
    assert [embeddings16.shape[0]] == placeholder_lengths(out16, "video") == [slots[0] // 4]
