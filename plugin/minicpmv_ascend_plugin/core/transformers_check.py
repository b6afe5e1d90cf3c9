"""The transformers requirement: one that has MiniCPM-V 4.6 and whose API vLLM can call.

- transformers >= 5.7.0 has `minicpmv4_6` (MiniCPMV4_6Config, its processors); vLLM's model
  module imports `MiniCPMV4_6Config` from it. The vllm-ascend v0.23.0 image pins 5.5.4, which
  lacks it: vLLM cannot even import the model.
- transformers 5.21.0 added a required `downsample_mode` argument to
  `MiniCPMV4_6ImageProcessor.find_best_resize`/`get_refine_size`; vLLM <= 0.33 calls them
  without it, so counting image tokens raises TypeError.
- 5.7.0 through 5.20.x behave the same for vLLM 0.23's calls; 5.14.1 (what vllm-ascend 0.25.1rc1
  pins) is this project's pin for the Ascend image.

Checked from package metadata and the package layout, without importing transformers.
"""

from __future__ import annotations

from .vllm_code import dist_version, package_dir, release

PIN = "5.14.1"
HAS_MODEL = (5, 7, 0)
NEW_SIGNATURES = (5, 21, 0)
LAST_VLLM_WITH_OLD_CALLS = (0, 33)


def problem(transformers_version: str | None, has_model: bool, vllm_version: str) -> str | None:
    """Why this transformers cannot serve MiniCPM-V 4.6 with this vLLM, or None if it can."""
    fix = f"install transformers=={PIN} (any 5.7.0 - 5.20.x works)"
    if transformers_version is None:
        return f"transformers is not installed: {fix}"
    if not has_model:
        return (f"transformers {transformers_version} has no MiniCPM-V 4.6 (`minicpmv4_6` arrived in "
                f"{'.'.join(map(str, HAS_MODEL))}; vllm-ascend 0.23.0 images ship 5.5.4): {fix}")
    try:
        old_calls = release(vllm_version)[:2] <= LAST_VLLM_WITH_OLD_CALLS
    except ValueError:  # unknown vLLM version: cannot tell, do not block
        old_calls = False
    if release(transformers_version) >= NEW_SIGNATURES and old_calls:
        return (f"transformers {transformers_version} changed MiniCPMV4_6ImageProcessor."
                "find_best_resize()/get_refine_size() (a required downsample_mode, since 5.21.0), "
                f"which vLLM {vllm_version} calls the old way (TypeError when counting image "
                f"tokens): {fix}")
    return None


def current_problem(vllm_version: str) -> str | None:
    root = package_dir("transformers")
    has_model = bool(root and (root / "models" / "minicpmv4_6").is_dir())
    return problem(dist_version("transformers"), has_model, vllm_version)
