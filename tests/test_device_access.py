"""A non-root server on an NPU host without the driver's group stops at once with the fix.

The Ascend device nodes keep the host's numeric owner and group inside a container (HwHiAiUser,
mode 0660). A fake /dev (regular files with those modes and a group the test user lacks) stands in
for the host's, since this machine has no NPU; the check itself runs for real as a non-root user
(`setpriv` drops this root test process to nobody), with os.access's own judgement of the real
credentials and supplementary groups.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

from minicpmv_ascend import settings
from minicpmv_ascend.settings import ConfigError
from support.server import REPO, clean_env

NOBODY = 65534
DRIVER_GID = 4242  # the host's HwHiAiUser in this test: a group nobody is not in
NODES = ("davinci0", "davinci1", "davinci_manager", "devmm_svm", "hisi_hdc")

needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                reason="needs root (to create nodes of a foreign group) and setpriv")


@pytest.fixture
def fake_dev():
    """A /dev with two NPUs and the control devices, owned root:DRIVER_GID, mode 0660, in a
    directory every user may enter (pytest's tmp_path is private to root)."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="fake-dev-"))
    root.chmod(0o755)
    for name in NODES:
        (root / name).touch()
        if os.geteuid() == 0:
            os.chown(root / name, 0, DRIVER_GID)
        (root / name).chmod(0o660)
    (root / "null").touch()
    yield root
    shutil.rmtree(root)


CHECK = textwrap.dedent("""\
    import sys
    from minicpmv_ascend import settings
    environ = {"MODEL_PATH": "OpenBMB/MiniCPM-V-4.6-Thinking", "VLLM_USE_MODELSCOPE": "1", **dict(a.split("=", 1) for a in sys.argv[2:])}
    try:
        plan = settings.build_plan(settings.resolve([], environ), environ, "ascend", dev_dir=sys.argv[1])
    except settings.ConfigError as err:  # what the launcher does with it
        print(f"minicpmv-ascend: {err}", file=sys.stderr)
        sys.exit(settings.EXIT_CONFIG_ERROR)
    print("ok", *plan.notes)
""")


def check_as_nobody(dev: pathlib.Path, *env: str, groups: str | None = None) -> subprocess.CompletedProcess:
    credentials = ["--reuid", str(NOBODY), "--regid", str(NOBODY)]
    credentials += ["--groups", groups] if groups else ["--clear-groups"]
    return subprocess.run(["setpriv", *credentials, sys.executable, "-c", CHECK, str(dev), *env],
                          capture_output=True, text=True, timeout=120, cwd="/",
                          env=clean_env(PYTHONPATH=str(REPO / "src"), HOME="/nonexistent"))


@needs_root
def test_wrong_group_stops_with_exit_2_and_the_gid_to_add(fake_dev) -> None:
    result = check_as_nobody(fake_dev)
    assert result.returncode == 2, result.stdout + result.stderr
    message = result.stderr
    assert "configuration error in `NPU device access`" in message
    assert "cannot read and write the NPU device nodes" in message
    for name in NODES:  # every node it would open is named, with the mode and owner that block it
        assert f"/dev/{name} (mode -rw-rw----, owner 0:{DRIVER_GID})" in message
    assert f"uid {NOBODY}, groups {NOBODY}" in message
    assert f"HWHIAIUSER_GID={DRIVER_GID}" in message and f"supplementalGroups: [{DRIVER_GID}]" in message
    assert "stat -c %g /dev/davinci_manager" in message


@needs_root
def test_with_the_drivers_group_the_same_user_passes(fake_dev) -> None:
    result = check_as_nobody(fake_dev, groups=str(DRIVER_GID))
    assert result.returncode == 0 and result.stdout.startswith("ok"), result.stderr


@needs_root
def test_only_the_devices_it_will_use_are_checked(fake_dev) -> None:
    """Logical id 1 of ASCEND_RT_VISIBLE_DEVICES is the second davinci node: davinci0 (which the
    process will not open) may belong to someone else; davinci1 may not."""
    os.chown(fake_dev / "davinci0", 0, 0)
    for name in ("davinci1", "davinci_manager", "devmm_svm", "hisi_hdc"):
        (fake_dev / name).chmod(0o666)
    assert check_as_nobody(fake_dev, "ASCEND_RT_VISIBLE_DEVICES=1").returncode == 0
    denied = check_as_nobody(fake_dev, "ASCEND_RT_VISIBLE_DEVICES=0")
    assert denied.returncode == 2 and "/dev/davinci0 (mode -rw-rw----, owner 0:0)" in denied.stderr
    assert "/dev/davinci1" not in denied.stderr
    # Ascend Docker Runtime's ASCEND_VISIBLE_DEVICES holds the nodes' own numbers.
    assert check_as_nobody(fake_dev, "ASCEND_VISIBLE_DEVICES=1").returncode == 0
    assert check_as_nobody(fake_dev, "ASCEND_VISIBLE_DEVICES=0-1").returncode == 2


@needs_root
def test_devices_readable_by_their_owner_only_get_the_root_fix(fake_dev) -> None:
    for name in NODES:
        (fake_dev / name).chmod(0o600)
    result = check_as_nobody(fake_dev)
    assert result.returncode == 2 and "installed for root only" in result.stderr
    assert "HWHIAIUSER_GID" not in result.stderr


def test_device_nodes_chosen_from_the_visible_devices(tmp_path) -> None:
    for name in ("davinci0", "davinci2", "davinci10", "davinci_manager", "hisi_hdc"):
        (tmp_path / name).touch()
    names = lambda env: [p.name for p in settings.ascend_device_nodes(env, tmp_path)]  # noqa: E731
    control = ["davinci_manager", "hisi_hdc"]  # devmm_svm is absent here: only present ones
    assert names({}) == ["davinci0", "davinci2", "davinci10", *control]  # numeric order
    assert names({"ASCEND_RT_VISIBLE_DEVICES": "1"}) == ["davinci2", *control]  # logical: 2nd node
    assert names({"ASCEND_RT_VISIBLE_DEVICES": "0,2"}) == ["davinci0", "davinci10", *control]
    assert names({"ASCEND_VISIBLE_DEVICES": "10"}) == ["davinci10", *control]  # the node's number
    assert names({"ASCEND_VISIBLE_DEVICES": "0-2"}) == ["davinci0", "davinci2", *control]
    assert names({"ASCEND_RT_VISIBLE_DEVICES": "7"}) == ["davinci0", "davinci2", "davinci10", *control]
    assert settings.ascend_device_nodes({}, tmp_path / "absent") == []


def test_missing_control_device_is_noted_in_the_plan(fake_dev) -> None:
    (fake_dev / "devmm_svm").unlink()
    environ = {"MODEL_PATH": "OpenBMB/MiniCPM-V-4.6-Thinking", "VLLM_USE_MODELSCOPE": "1"}
    if os.geteuid() == 0:  # root passes the access check whatever the group
        plan = settings.build_plan(settings.resolve([], environ), environ, "ascend", dev_dir=fake_dev)
        assert any("/dev/devmm_svm missing" in note for note in plan.notes)


def test_not_checked_off_ascend_or_without_npus(tmp_path) -> None:
    environ = {"MODEL_PATH": "OpenBMB/MiniCPM-V-4.6-Thinking", "VLLM_USE_MODELSCOPE": "1"}
    for name in NODES:
        (tmp_path / name).touch(mode=0o000)
    settings.build_plan(settings.resolve([], environ), environ, "cpu", dev_dir=tmp_path)
    with pytest.raises(ConfigError, match="only 0 device"):  # no davinci node: the count check speaks
        settings.build_plan(settings.resolve([], environ), environ, "ascend", dev_dir=tmp_path / "none")
