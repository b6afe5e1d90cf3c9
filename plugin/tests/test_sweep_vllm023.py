"""Placeholder counts and token sequences: vLLM 0.23 (without / with the plugin) against
transformers' own MiniCPM-V 4.6 processor, over 2,048 image sizes x {16x, 4x} x {default,
per-request max_slice_nums}.

Reference: transformers' MiniCPMV4_6Processor (token ids of `<|image_pad|>` + one image). For
speed the sweep runs it with the shape-only image processor of `hf_processor(sizing_only=True)`;
`test_sizing_only_reference_is_transformers` shows it gives the stock processor's ids.
vLLM side: the placeholder text vLLM 0.23's `_get_prompt_updates` builds, tokenized by the
checkpoint's tokenizer; `test_placeholder_path_is_vllms_apply` shows that equals `apply()`.
"""

from __future__ import annotations

import json
import math
import random
import time

from _vllm023 import IMAGE_PAD, REPO, hf_image_ids, hf_processor

N_SIZES = 2048
ANCHORS = [(1084, 820), (820, 1084), (365, 211), (153, 174), (448, 448), (4000, 30)]
MAX_SLICE_CYCLE = (2, 3, 4, 5, 6, 1, 8)  # per-request values; 9 is the default
CONFIGS = (("16x", False), ("4x", False), ("16x", True), ("4x", True))
VERSION_FIX = "processor-version"
PROCESSING_FIXES = (VERSION_FIX, "image-size-order", "max-slice-nums")
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


def test_sizing_only_reference_is_transformers(checkpoint):
    stock, fast = hf_processor(checkpoint), hf_processor(checkpoint, sizing_only=True)
    sizes = sweep_sizes()[:: N_SIZES // 24]
    for index, (w, h) in enumerate(sizes[:1] + sizes):
        for mode, with_max_slices in CONFIGS:
            kwargs = request_kwargs(index, mode, with_max_slices)
            assert hf_image_ids(fast, w, h, **kwargs) == hf_image_ids(stock, w, h, **kwargs), (w, h, kwargs)


def test_placeholder_path_is_vllms_apply(vllm023):
    vllm023.apply(*PROCESSING_FIXES)
    import torch

    for index, (w, h) in enumerate(sweep_sizes()[:6]):
        for mode, with_max_slices in CONFIGS:
            kwargs = request_kwargs(index, mode, with_max_slices)
            out = vllm023.process(IMAGE_PAD, images=[torch.zeros(3, h, w, dtype=torch.uint8)], **kwargs)
            assert out["prompt_token_ids"] == vllm023.encode([vllm023.image_placeholder(w, h, **kwargs)])[0]


def test_sweep_against_transformers(vllm023, checkpoint):
    from minicpmv_ascend_plugin.image_size_order import Plan

    started = time.monotonic()
    sizes = sweep_sizes()
    reference = hf_processor(checkpoint, sizing_only=True)
    pad = vllm023.image_pad_id
    cases = [(i, w, h, mode, m) for mode, m in CONFIGS for i, (w, h) in enumerate(sizes)]
    expected = [hf_image_ids(reference, w, h, **request_kwargs(i, mode, m)) for i, w, h, mode, m in cases]
    hf_seconds = time.monotonic() - started

    def texts(*patches: str, **options: object) -> list[str]:
        vllm023.apply(*patches, **options)
        return [vllm023.image_placeholder(w, h, **request_kwargs(i, mode, m)) for i, w, h, mode, m in cases]

    variants = {
        "vLLM 0.23 (+ version fix only)": texts(VERSION_FIX),
        "size order fixed, layout not (vLLM 0.24-style)": texts(
            *PROCESSING_FIXES, plan=Plan(swap_size=True, columns_first=False, how="test")),
        "vLLM 0.23 + plugin": texts(*PROCESSING_FIXES),
    }
    fixed = variants["vLLM 0.23 + plugin"]
    fixed_ids = vllm023.encode(fixed)

    table: dict[str, dict[str, dict[str, int]]] = {}
    for name, got in variants.items():
        table[name] = {}
        for mode, m in CONFIGS:
            rows = [k for k, case in enumerate(cases) if case[3] == mode and case[4] == m]
            config = f"{mode} {'max_slice_nums' if m else 'default'}"
            counts = sum(got[k].count(IMAGE_PAD) != expected[k].count(pad) for k in rows)
            if got is fixed:
                sequences = sum(fixed_ids[k] != expected[k] for k in rows)
            else:  # the fixed text tokenizes to transformers' ids (asserted below): compare texts
                sequences = sum(got[k] != fixed[k] for k in rows)
            table[name][config] = {"sizes": len(rows), "count_mismatches": counts, "sequence_mismatches": sequences}

    REPORT.update(sizes=len(sizes), cases=len(cases), seconds=round(time.monotonic() - started, 1),
                  transformers_seconds=round(hf_seconds, 1), table=table,
                  anchor_1084x820={name: [got[k].count(IMAGE_PAD) for k, c in enumerate(cases) if c[0] == 0]
                                   for name, got in variants.items()},
                  anchor_expected=[expected[k].count(pad) for k, c in enumerate(cases) if c[0] == 0])
    (REPO / "build").mkdir(exist_ok=True)
    (REPO / "build" / "plugin-sweep-vllm023.json").write_text(json.dumps(REPORT, indent=1))

    after = table["vLLM 0.23 + plugin"]
    assert all(v["count_mismatches"] == 0 and v["sequence_mismatches"] == 0 for v in after.values()), after
    before = table["vLLM 0.23 (+ version fix only)"]
    assert all(v["count_mismatches"] > 0 for v in before.values()), before
    partial = table["size order fixed, layout not (vLLM 0.24-style)"]
    assert all(v["count_mismatches"] == 0 and v["sequence_mismatches"] > 0 for v in partial.values()), partial
    assert REPORT["anchor_expected"] == [441, 1764, 183, 732]
    assert REPORT["anchor_1084x820"]["vLLM 0.23 (+ version fix only)"][0] == 495
