"""Backport: each image/video is encoded with its own 4x/16x mode."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core.patch import AT_MODEL_IMPORT, Patch

NAME = "vit-merger-flags"
VIDEO_FLAG = "video_use_vit_merger"


def item_flags(value: Any, num_items: int) -> list[bool | None]:
    """One merger flag per item from a batched field (a tensor, or a list of 1-element tensors)."""
    import torch

    if value is None:
        return [None] * num_items
    values: list[Any] = []
    for part in value if isinstance(value, list | tuple) else [value]:
        values.extend(part.reshape(-1).tolist() if isinstance(part, torch.Tensor) else [part])
    if len(values) == num_items:
        return [bool(v) for v in values]
    if len(values) == 1:
        return [bool(values[0])] * num_items
    return [any(bool(v) for v in values)] * num_items  # unexpected shape: one mode, as before


def _process_vision_input(self: Any, image_input: Any, use_vit_merger: Any = None) -> Any:
    """Encode the items of a batch grouped by their merger flag, in their original order."""
    import torch

    module = _process_vision_input.module  # type: ignore[attr-defined]
    if image_input["type"] == "image_embeds":
        return image_input["image_embeds"]
    num_slices = image_input["num_slices"].tolist()
    offsets = [0]
    for n in num_slices:
        offsets.append(offsets[-1] + n)
    flags = item_flags(use_vit_merger, len(num_slices))
    encoded: dict[int, Any] = {}
    for flag in dict.fromkeys(flags):
        items = [i for i, f in enumerate(flags) if f == flag]
        group = module.MiniCPMVImagePixelInputs(
            type="pixel_values",
            pixel_values=[pv for i in items for pv in image_input["pixel_values"][offsets[i]:offsets[i + 1]]],
            tgt_sizes=torch.cat([image_input["tgt_sizes"][offsets[i]:offsets[i + 1]] for i in items]),
            num_slices=torch.tensor([num_slices[i] for i in items]),
        )
        mode = None if flag is None else ("16x" if flag else "4x")
        features = self.get_vision_hidden_states(group, downsample_mode=mode)
        start = 0
        for i in items:
            encoded[i] = torch.cat(features[start:start + num_slices[i]], dim=0)
            start += num_slices[i]
    return [encoded[i] for i in range(len(num_slices))]


def embed_multimodal(self: Any, **kwargs: Any) -> Any:
    """vLLM 0.23's embed_multimodal with the image and the video flags kept per item."""
    image_flags = kwargs.pop("use_vit_merger", None)
    video_flags = kwargs.pop(VIDEO_FLAG, None)
    image_kwargs = {k: v for k, v in kwargs.items() if k in ("pixel_values", "image_embeds", "tgt_sizes")}
    video_kwargs = {k.removeprefix("video_"): v for k, v in kwargs.items() if k.startswith("video_")}
    embeddings: tuple[Any, ...] = ()
    for modality_kwargs, flags in ((image_kwargs, image_flags), (video_kwargs, video_flags)):
        if modality_kwargs.get("pixel_values") is None and modality_kwargs.get("image_embeds") is None:
            continue
        vision_input = self._parse_and_validate_vision_input(**modality_kwargs)
        if vision_input is not None:
            embeddings += tuple(self._process_vision_input(vision_input, use_vit_merger=flags))
    return embeddings if embeddings else []


def check(module: ModuleType) -> str | None:
    fields = module.MiniCPMV4_6MultiModalProcessor._get_mm_fields_config(
        None, {"use_vit_merger": None, VIDEO_FLAG: None}, {})
    if VIDEO_FLAG in fields:
        return "vLLM encodes each item with its own merger flag, videos with theirs (vLLM >= 0.32)"
    return None


def apply(module: ModuleType) -> None:
    import torch
    from vllm.multimodal.inputs import MultiModalFieldConfig

    processor_cls = module.MiniCPMV4_6MultiModalProcessor
    model_cls = module.MiniCPMV4_6ForConditionalGeneration
    original_videos = processor_cls.process_videos
    original_fields = processor_cls._get_mm_fields_config

    def process_videos(self: Any, mm_data: Any, mm_kwargs: Any, *args: Any, **kwargs: Any) -> Any:
        outputs = dict(original_videos(self, mm_data, mm_kwargs, *args, **kwargs))
        videos = outputs.get("video_pixel_values")
        if videos is not None and len(videos):
            insert_layer_id = getattr(self.info.get_hf_config(), "insert_layer_id", -1)
            flag = self._resolve_downsample_mode(mm_kwargs) != "4x" and insert_layer_id >= 0
            outputs[VIDEO_FLAG] = [torch.tensor([flag], dtype=torch.bool) for _ in videos]
        return outputs

    def _get_mm_fields_config(self: Any, hf_inputs: Any, *args: Any, **kwargs: Any) -> Any:
        fields = dict(original_fields(self, hf_inputs, *args, **kwargs))
        if VIDEO_FLAG in hf_inputs:
            fields[VIDEO_FLAG] = MultiModalFieldConfig.batched("video")
        return fields

    _process_vision_input.module = module  # type: ignore[attr-defined]
    processor_cls.process_videos = process_videos
    processor_cls._get_mm_fields_config = _get_mm_fields_config
    model_cls.embed_multimodal = embed_multimodal
    model_cls._process_vision_input = _process_vision_input


PATCH = Patch(
    name=NAME,
    stage=AT_MODEL_IMPORT,
    summary="per-item 4x/16x merger flags in encoder batches, and a separate flag for videos",
    upstream=f"vLLM >= 0.32 minicpmv4_6.py (_expand_flags / grouping in _process_vision_input, {VIDEO_FLAG}); "
             "absent in 0.25.1",
    check=check,
    apply=apply,
    fixes="one `any()` 4x/16x decision for a whole encoder batch; videos without a flag (always the config's 16x)",
    tests='`test_mixed_4x_16x_encoder_batch`, `test_video_follows_its_own_4x_mode`',
    delete_when='vLLM >= 0.32',
    details=f"""
adds `{VIDEO_FLAG}` (processor output + field config) and replaces
`embed_multimodal` / `_process_vision_input` with versions that keep one flag per item and per
modality and encode the batch grouped by flag, in order. Predicate: the processor's field config
has no `{VIDEO_FLAG}` (both halves landed together upstream).
""",
    evidence={"0.30.0": ('applied', ('`minicpmv4_6.py:76-90`: the field config has `use_vit_merger` and no '
                         f"`{VIDEO_FLAG}`; `:1192-1202` `embed_multimodal` collapses a batch's flags with "
                         '`.any()`, and videos get the image flag (:1235). A 4x image batched with a 16x one gets '
                         '16x embeddings without the plugin'))},
)
