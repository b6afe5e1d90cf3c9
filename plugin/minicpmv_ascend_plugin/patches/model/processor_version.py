"""Backport: MiniCPM-V 4.6 uses transformers' own processor, not the vendored pre-4.6 one."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core.patch import AT_MODEL_IMPORT, Patch

NAME = "processor-version"


def get_hf_processor(self: Any, **kwargs: object) -> Any:
    """MiniCPM-V 4.6: the native transformers processor (backport of vLLM #44980)."""
    import numpy as np

    hf_processor = self.ctx.get_hf_processor(**kwargs)
    image_processor = getattr(hf_processor, "image_processor", None)
    if image_processor is not None:
        # transformers' image transforms accept sequences, not ndarrays (as vLLM does for 4.5).
        for attr in ("mean", "std", "image_mean", "image_std"):
            value = getattr(image_processor, attr, None)
            if isinstance(value, np.ndarray):
                setattr(image_processor, attr, value.tolist())
    return hf_processor


def check(module: ModuleType) -> str | None:
    info = module.MiniCPMV4_6ProcessingInfo
    if "get_hf_processor" in vars(info):
        return "MiniCPMV4_6ProcessingInfo returns the native processor (vLLM #44980, >= 0.24)"
    return None


def apply(module: ModuleType) -> None:
    module.MiniCPMV4_6ProcessingInfo.get_hf_processor = get_hf_processor


PATCH = Patch(
    name=NAME,
    stage=AT_MODEL_IMPORT,
    summary="native MiniCPMV4_6Processor instead of the vendored one that reads image_processor.version",
    upstream="vllm-project/vllm#44980 (vLLM >= 0.24.0); vllm-project/vllm-ascend#13491",
    check=check,
    apply=apply,
    fixes=("`AttributeError: 'MiniCPMV4_6ImageProcessor' object has no attribute 'version'` on the first image and in the "
     'profiling dummy inputs (no server start)'),
    tests='`test_processor_version_crash_without_and_hf_processor_with_the_patch`',
    delete_when='vLLM >= 0.24',
    details="""
`MiniCPMV4_6ProcessingInfo` inherits the pre-4.6 `get_hf_processor`,
which wraps the processor in vLLM's vendored `MiniCPMVProcessor` whose `__init__` reads
`image_processor.version`. The backport adds the 0.24 method that returns transformers' own
`MiniCPMV4_6Processor`. Predicate: the class does not define `get_hf_processor` itself.
""",
    evidence={"0.30.0": ('not needed', ('`model_executor/models/minicpmv4_6.py:483`: `MiniCPMV4_6ProcessingInfo.get_hf_processor` '
                         "returns transformers' own processor (vLLM #44980)"))},
)
