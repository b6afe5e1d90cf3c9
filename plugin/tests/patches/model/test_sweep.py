"""Placeholder counts and token sequences: the target's vLLM (without / with the plugin) against
transformers' own MiniCPM-V 4.6 processor, over 2,048 image sizes x {16x, 4x} x {default,
per-request max_slice_nums}.

Reference: transformers' MiniCPMV4_6Processor (token ids of `<|image_pad|>` + one image). For
speed the sweep runs it with the shape-only image processor of `hf_processor(sizing_only=True)`;
`test_sizing_only_reference_is_transformers` shows it gives the stock processor's ids.
vLLM side: the placeholder vLLM's `_get_prompt_updates` builds (0.23: text, tokenized by the
checkpoint's tokenizer; 0.30: token ids); `test_placeholder_path_is_vllms_apply` shows that equals
`apply()`.
"""

from __future__ import annotations

import json
import math
import random
import time

import pytest

from _target import IMAGE_PAD, REPO, hf_image_ids, hf_processor

N_SIZES = 2048
ANCHORS = [(1084, 820), (820, 1084), (365, 211), (153, 174), (448, 448), (4000, 30)]
MAX_SLICE_CYCLE = (2, 3, 4, 5, 6, 1, 8)  # per-request values; 9 is the default
CONFIGS = (("16x", False), ("4x", False), ("16x", True), ("4x", True))
VERSION_FIX = "processor-version"
REPORT: dict[str, object] = {}


def sweep_sizes() -> list[tuple[int, int]]:
    rng = random.Random(46)
    sizes = list(dict.fromkeys(ANCHORS))
    seen = set(sizes)
    while len(sizes) < N_SIZES:
        w, h = (round(math.exp(rng.uniform(math.log(28), math.log(4000)))) for _ in range(2))
        if (w, h) not in seen:
            seen.add((w, h))
            sizes.append((w, h))
    return sizes


def request_kwargs(index: int, mode: str, with_max_slices: bool) -> dict[str, object]:
    kwargs: dict[str, object] = {"downsample_mode": mode}
    if with_max_slices:
        kwargs["max_slice_nums"] = 2 if index == 0 else MAX_SLICE_CYCLE[index % len(MAX_SLICE_CYCLE)]
    return kwargs


def test_sizing_only_reference_is_transformers(checkpoint, target):
    if not target.first_with_its_transformers:
        pytest.skip(f"transformers {target.transformers_pin} alone, no vLLM code: proven on the first target "
                    "that pins it")
    stock, fast = hf_processor(checkpoint), hf_processor(checkpoint, sizing_only=True)
    sizes = sweep_sizes()[:: N_SIZES // 24]
    for index, (w, h) in enumerate(sizes[:1] + sizes):
        for mode, with_max_slices in CONFIGS:
            kwargs = request_kwargs(index, mode, with_max_slices)
            assert hf_image_ids(fast, w, h, **kwargs) == hf_image_ids(stock, w, h, **kwargs), (w, h, kwargs)


def test_placeholder_path_is_vllms_apply(vllm_code, target):
    vllm_code.apply(*target.processing_fixes())
    import torch

    for index, (w, h) in enumerate(sweep_sizes()[:6]):
        for mode, with_max_slices in CONFIGS:
            kwargs = request_kwargs(index, mode, with_max_slices)
            out = vllm_code.process(IMAGE_PAD, images=[torch.zeros(3, h, w, dtype=torch.uint8)], **kwargs)
            assert out["prompt_token_ids"] == vllm_code.placeholder_ids(w, h, **kwargs)


def test_sweep_image_tokens_equal_transformers_processor(vllm_code, target, checkpoint):
    from minicpmv_ascend_plugin.patches.model.image_size_order import Plan

    started = time.monotonic()
    sizes = sweep_sizes()
    reference = hf_processor(checkpoint, sizing_only=True)
    pad = vllm_code.image_pad_id
    cases = [(i, w, h, mode, m) for mode, m in CONFIGS for i, (w, h) in enumerate(sizes)]
    expected = [hf_image_ids(reference, w, h, **request_kwargs(i, mode, m)) for i, w, h, mode, m in cases]
    hf_seconds = time.monotonic() - started

    def placeholders(*patches: str, **options: object) -> list[str | list[int]]:
        vllm_code.apply(*patches, **options)
        return [vllm_code.image_placeholder(w, h, **request_kwargs(i, mode, m)) for i, w, h, mode, m in cases]

    def pads(placeholder: str | list[int]) -> int:
        return placeholder.count(IMAGE_PAD if isinstance(placeholder, str) else pad)

    # vLLM 0.23 needs the version fix to process any image at all.
    released = f"{target.name} (+ version fix only)" if target.needs(VERSION_FIX) else f"{target.name} as released"
    fixed = f"{target.name} + plugin"
    variants = {released: placeholders(*[VERSION_FIX] * target.needs(VERSION_FIX))}
    if target.needs("image-size-order"):
        variants["size order fixed, layout not (vLLM 0.24-style)"] = placeholders(
            *target.processing_fixes(), plan=Plan(swap_size=True, columns_first=False, how="test"))
    variants[fixed] = placeholders(*target.processing_fixes())
    fixed_ids = vllm_code.ids(variants[fixed])

    table: dict[str, dict[str, dict[str, int]]] = {}
    for name, got in variants.items():
        table[name] = {}
        for mode, m in CONFIGS:
            rows = [k for k, case in enumerate(cases) if case[3] == mode and case[4] == m]
            config = f"{mode} {'max_slice_nums' if m else 'default'}"
            if name == fixed:
                sequences = sum(fixed_ids[k] != expected[k] for k in rows)
            else:  # the fixed placeholders are transformers' ids (asserted below): compare with them
                sequences = sum(got[k] != variants[fixed][k] for k in rows)
            table[name][config] = {"sizes": len(rows), "sequence_mismatches": sequences,
                                   "count_mismatches": sum(pads(got[k]) != expected[k].count(pad) for k in rows)}

    REPORT.update(target=f"vLLM {target.vllm}", sizes=len(sizes), cases=len(cases),
                  seconds=round(time.monotonic() - started, 1), transformers_seconds=round(hf_seconds, 1),
                  table=table,
                  anchor_1084x820={name: [pads(got[k]) for k, c in enumerate(cases) if c[0] == 0]
                                   for name, got in variants.items()},
                  anchor_expected=[expected[k].count(pad) for k, c in enumerate(cases) if c[0] == 0])
    (REPO / "build").mkdir(exist_ok=True)
    (REPO / "build" / f"plugin-sweep-{target.tag}.json").write_text(json.dumps(REPORT, indent=1))

    assert all(v["count_mismatches"] == 0 and v["sequence_mismatches"] == 0 for v in table[fixed].values()), table
    assert REPORT["anchor_expected"] == [441, 1764, 183, 732]
    before = table[released]
    for config, v in before.items():
        wrong = target.needs("image-size-order") or (target.needs("max-slice-nums") and "max_slice_nums" in config)
        # Where the target needs a fix, its own code gets sizes wrong; where not, it is transformers'.
        assert (v["count_mismatches"] > 0) if wrong else (v["count_mismatches"] == v["sequence_mismatches"] == 0), \
            (config, before)
    if target.needs("image-size-order"):
        partial = table["size order fixed, layout not (vLLM 0.24-style)"]
        assert all(v["count_mismatches"] == 0 and v["sequence_mismatches"] > 0 for v in partial.values()), partial
        assert REPORT["anchor_1084x820"][released][0] == 495
