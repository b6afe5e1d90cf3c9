"""Backport: image placeholders computed with transformers' (height, width) order."""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any

from ...core.patch import AT_MODEL_IMPORT, LayoutNotFound, Patch
from ...core.vllm_code import release, vllm_version

NAME = "image-size-order"
PROBE_W, PROBE_H = 300, 200  # any non-square size
PROBE_GRID = [2, 3]  # transformers' (rows, columns)


@dataclasses.dataclass(frozen=True)
class Plan:
    swap_size: bool  # vLLM passes (width, height) to transformers
    columns_first: bool  # vLLM's layout reads the grid as (columns, rows)
    how: str  # "probe" or "version"


class _ImageProcessorProbe:
    """Stands in for transformers' image processor; records the size order vLLM passes."""

    max_slice_nums, patch_size, scale_resolution, downsample_mode = 9, 14, 448, "16x"

    def __init__(self) -> None:
        self.sizes: set[tuple[int, ...]] = set()

    def _record(self, image_size: Any, *_: Any, **__: Any) -> Any:
        self.sizes.add(tuple(int(v) for v in image_size))
        return (448, 448)

    find_best_resize = get_refine_size = _record

    def get_sliced_grid(self, image_size: Any, *_: Any, **__: Any) -> None:
        self._record(image_size)
        return None  # "no slicing": the shortest path through vLLM's method


class _TokenizerProbe:
    image_token, video_token = "<I>", "<V>"
    image_start_token, image_end_token = "<im>", "</im>"
    slice_start_token, slice_end_token = "<sl>", "</sl>"
    image_id_start_token, image_id_end_token = "<id>", "</id>"


def _probe_info(module: ModuleType, **methods: Any) -> Any:
    info = object.__new__(module.MiniCPMV4_6ProcessingInfo)  # real class, no processing context
    for name, value in methods.items():
        setattr(info, name, value)
    return info


def _rows(text: str) -> int:
    return text.count("\n") + 1


def probe(module: ModuleType) -> Plan:
    """Call vLLM's own methods with a probe image processor/tokenizer and see what they do."""
    from vllm.multimodal.parse import ImageSize

    size = ImageSize(width=PROBE_W, height=PROBE_H)
    recorder = _ImageProcessorProbe()
    info = _probe_info(module, get_image_processor=lambda **_: recorder)
    module.MiniCPMV4_6ProcessingInfo._compute_visual_tokens(info, size, 9, downsample_mode="16x")
    if recorder.sizes not in ({(PROBE_W, PROBE_H)}, {(PROBE_H, PROBE_W)}):
        raise ValueError(f"unexpected sizes handed to transformers: {recorder.sizes}")
    swap_size = recorder.sizes == {(PROBE_W, PROBE_H)}

    info = _probe_info(
        module,
        _compute_visual_tokens=lambda *_, **__: (list(PROBE_GRID), 1, 1),
        get_image_processor=lambda **_: object(),
        get_tokenizer=lambda: _TokenizerProbe(),
        get_video_max_slice_num=lambda: 9,
    )
    image = module.MiniCPMV4_6ProcessingInfo.get_slice_image_placeholder(
        info, size, image_idx=0, use_image_id=False, downsample_mode="16x")
    processor = object.__new__(module.MiniCPMV4_6MultiModalProcessor)
    processor.info = info
    video = module.MiniCPMV4_6MultiModalProcessor.get_video_prompt_texts(
        processor, size, 1, downsample_mode="16x", video_idx=0)
    layouts = {"image": _rows(image), "video": _rows(video)}
    if set(layouts.values()) - set(PROBE_GRID) or len(set(layouts.values())) != 1:
        raise ValueError(f"unexpected slice layouts (rows of a {PROBE_GRID} grid): {layouts}")
    return Plan(swap_size, layouts["image"] == PROBE_GRID[1], "probe")


def plan(module: ModuleType) -> Plan:
    try:
        return probe(module)
    except Exception as error:
        version = release(vllm_version())
        if version >= (0, 25):  # a release the history says is fixed, in code the probe does not know
            raise LayoutNotFound(f"the probe of vLLM's placeholder code failed ({type(error).__name__}: "
                                 f"{error})") from error
        return Plan(version < (0, 24), version < (0, 25), "version")


def check(module: ModuleType) -> str | None:
    p = plan(module)
    if not (p.swap_size or p.columns_first):
        return f"vLLM passes (height, width) and lays slices out by rows (by {p.how}: vLLM >= 0.25)"
    return None


def apply(module: ModuleType) -> None:
    apply_plan(module, plan(module))


def apply_plan(module: ModuleType, p: Plan) -> None:
    """Wrap `_compute_visual_tokens` for `p` (tests use it to show partial fixes are wrong)."""
    from vllm.multimodal.parse import ImageSize

    info_cls = module.MiniCPMV4_6ProcessingInfo
    original = info_cls._compute_visual_tokens

    def _compute_visual_tokens(self: Any, image_size: Any, *args: Any, **kwargs: Any) -> Any:
        if p.swap_size:
            # This vLLM hands `image_size` to transformers as a tuple: make that tuple
            # (height, width), which is what transformers' methods unpack.
            image_size = ImageSize(width=image_size.height, height=image_size.width)
        grids, source_tokens, patch_tokens = original(self, image_size, *args, **kwargs)
        if p.columns_first:  # transformers' grid is (rows, columns); this layout reads (cols, rows)
            grids = [grids[1], grids[0]]
        return grids, source_tokens, patch_tokens

    _compute_visual_tokens.__wrapped__ = original  # type: ignore[attr-defined]
    info_cls._compute_visual_tokens = _compute_visual_tokens


PATCH = Patch(
    name=NAME,
    stage=AT_MODEL_IMPORT,
    summary="(height, width) to transformers when counting image tokens, slice rows laid out as transformers does",
    upstream="vllm-project/vllm#45244 (size order, vLLM 0.24.0); grid read as (rows, cols) in vLLM >= 0.25",
    check=check,
    apply=apply,
    fixes=('placeholders counted with (width, height) where transformers takes (height, width): wrong count for 10.7 % of '
     'sizes (1084x820: 495 vs 441); slice rows read as (cols, rows)'),
    tests='`test_image_size_order_1084x820`, `test_slice_layout_is_transformers`, the sweep',
    delete_when='vLLM >= 0.25',
    details="""
the trap is that 0.23 swaps (width, height) in the size *and*
(rows, columns) in the slice layout, and the two swaps cancel in the newline layout; backporting
only the size order (as 0.24.0 shipped) gives the right count and a transposed layout for every
non-square grid. The patch wraps `_compute_visual_tokens`: it hands vLLM's code the size in
(height, width) tuple order when vLLM passes it raw, and returns the grid in the order that
vLLM's layout code reads it; counts are products of the grid, so only the layout sees the order.
Predicate: vLLM's own `_compute_visual_tokens`, `get_slice_image_placeholder` and
`get_video_prompt_texts` are called with a recording stand-in for transformers' image processor
and tokenizer (which order reaches transformers; how many rows a 2x3 grid gets); if that probe
cannot run, the release (< 0.24 / < 0.25) decides.
""",
    evidence={"0.30.0": ('not needed', ('`minicpmv4_6.py:569`: `hf_image_size = (image_size.height, image_size.width)` handed to '
                         '`get_sliced_grid` / `find_best_resize` / `get_refine_size` (:573-604); `:655` `num_rows, '
                         'num_cols = grids[0], grids[1]`, and rows = `grids[0]` for videos (:151-153). The sweep: 0 '
                         'mismatches without the plugin in both modes'))},
)
