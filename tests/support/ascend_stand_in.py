"""Stand-ins for what only the vllm-ascend image or an NPU host has, written as files: the tests
that replay the Ascend image's build steps on the host (tests/test_deploy_build.py,
tests/test_deploy_images.py) put them on a PYTHONPATH or a fake root, and the container tests copy
them into the stand-in base image they build (tests/support/containers.py). Each stands in for one
thing and shows only how the kit meets it: none has CANN's, the driver's or vllm-ascend's code.
"""

from __future__ import annotations

import pathlib

# What torch_npu raises in a `docker build` container (no NPU driver mounted), vllm-ascend#1440.
HAL_ERROR = "libascend_hal.so: cannot open shared object file: No such file or directory"
STAND_IN_NPU = "fake-torch-npu-without-driver"


def npu_without_driver(site: pathlib.Path) -> None:
    """A torch_npu that fails like the real one where no driver is mounted (its C extension needs
    the driver's libascend_hal.so), registered as torch_npu registers itself (torch.backends), so
    that torch's own device-backend autoload hits it on `import torch`."""
    (site / "torch_npu").mkdir(parents=True)
    (site / "torch_npu" / "__init__.py").write_text(f"raise ImportError({HAL_ERROR!r})\n")
    dist = site / f"{STAND_IN_NPU.replace('-', '_')}-0.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {STAND_IN_NPU}\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = torch_npu:_autoload\n")


def vllm_ascend_package(site: pathlib.Path, version: str) -> None:
    """An importable `vllm_ascend` of the given release (distribution vllm_ascend, as the image's
    `pip install -e` leaves it), with none of its code: no platform plugin is registered, so vLLM
    never selects it; what the image's build byte-compiles and the plugin's version report read."""
    (site / "vllm_ascend").mkdir(parents=True)
    (site / "vllm_ascend" / "__init__.py").write_text(
        f'"""Stand-in of vllm-ascend {version}: importable, with none of its code (the kit\'s tests)."""\n')
    dist = site / f"vllm_ascend-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm_ascend\nVersion: {version}\n")


def cann_tree(root: pathlib.Path, version: str = "9.1.0", installed_at: str | None = None) -> pathlib.Path:
    """The layout of the CANN 9 base image under `root`: the toolkit's, the versioned
    ascendnpu-ir's and NNAL/ATB's set_env.sh, each exporting what shows it was sourced and with
    which arguments (FAKE_TOOLKIT, TOOLKIT_ARGC, FAKE_IR, ATB_ARGS). `installed_at`: where the tree
    is when it is sourced (/usr/local/Ascend in an image; default: `root` itself)."""
    home = root / f"cann-{version}"
    (root / "ascend-toolkit").mkdir(parents=True)
    (root / "ascend-toolkit" / "set_env.sh").write_text(
        f'export FAKE_TOOLKIT=1\nexport TOOLKIT_ARGC=$#\n'
        f'export ASCEND_TOOLKIT_HOME="{installed_at or root}/cann-{version}"\n')
    ir = home / "share" / "info" / "ascendnpu-ir" / "bin"
    ir.mkdir(parents=True)
    (ir / "set_env.sh").write_text("export FAKE_IR=1\n")
    (root / "nnal" / "atb").mkdir(parents=True)
    (root / "nnal" / "atb" / "set_env.sh").write_text('export ATB_ARGS="$*"\n')
    return root
