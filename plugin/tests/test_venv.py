"""This target's venv holds exactly its lock, and nothing in it runs another venv.

The Makefile builds a target venv whose lock differs from the first target's only in its vllm line
as a hard-linked copy of the first target's venv with its own vLLM swapped in (`DERIVED_TARGETS`):
these tests, run in every target venv, show the copy is what its lock says, no vLLM of the other
target left in it, and that building it left the first venv what its own lock says."""

from __future__ import annotations

import importlib.metadata
import pathlib
import re
import sys
import sysconfig

from _target import REPO, Target

# What a venv holds besides its lock: what `python -m venv` installs (ensurepip) and this repository
# (`pip install -e .`).
NOT_FROM_THE_LOCK = {"pip", "setuptools", "minicpmv-ascend"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_installed_distributions_are_exactly_the_lock(target: Target) -> None:
    lines = (REPO / target.test_lock).read_text().splitlines()
    pinned = dict(line.split("==") for line in lines if line and not line.startswith("#"))
    pinned = {canonical(name): version for name, version in pinned.items()}
    installed = [(canonical(d.metadata["Name"]), d.version)
                 for d in importlib.metadata.distributions(path=[sysconfig.get_paths()["purelib"]])]
    names = [name for name, _ in installed]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)  # one vLLM, say
    mine = {name: version for name, version in installed if name not in NOT_FROM_THE_LOCK}
    assert mine == pinned, ({n: v for n, v in mine.items() if pinned.get(n) != v},
                            {n: v for n, v in pinned.items() if mine.get(n) != v})
    assert pinned["vllm"] == target.vllm


def test_nothing_in_the_venv_names_another_venv() -> None:
    """Its scripts' interpreters and pyvenv.cfg name this venv (a copy's are rewritten)."""
    prefix = pathlib.Path(sys.prefix)
    venv_path = re.compile(re.escape(str(prefix.parent)) + r"/\.venv[\w-]*")
    files = [prefix / "pyvenv.cfg", *(p for p in (prefix / "bin").iterdir() if p.is_file() and not p.is_symlink())]
    named = {}
    for path in files:
        data = path.read_bytes()
        if b"\0" not in data[:1024]:  # text: scripts, activate, pyvenv.cfg
            named[path.name] = set(venv_path.findall(data.decode(errors="replace")))
    assert named["pyvenv.cfg"] <= {str(prefix)} and named["pip"] == {str(prefix)}, named
    assert all(found <= {str(prefix)} for found in named.values()), {n: f for n, f in named.items() if f - {str(prefix)}}
