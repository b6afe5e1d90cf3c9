"""What a session fixture makes, made once per run however many pytest-xdist workers ask for it: the
tiny checkpoints and config, the rendered Kubernetes objects. Each worker is a session of its own,
so a plain session fixture runs once per worker: 3-10 CPU-seconds each time, spent twice by
`make check` and `make test`."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable

import filelock
import pytest


def once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[pathlib.Path], object],
         meanwhile: Callable[[], object] | None = None) -> pathlib.Path:
    """The path `name` in this run's temporary directory, made by `make(path)` the first time any
    worker asks; the others wait on its lock, then use it as it is. What is made must be read only
    (every user copies before changing it, as a session fixture's users must anyway).

    `meanwhile`: the part of `make`'s work that every worker does anyway (importing what it needs),
    done outside the lock while the thing is not made yet, so that a worker that would wait for
    another's `make` does it in the meantime rather than idle."""
    base = tmp_path_factory.getbasetemp()
    # Under xdist every worker's base is a directory of the run's own (popen-gw0, ...); without it,
    # the base's parent holds the previous runs.
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / name
    done = root / f"{name}.done"
    if meanwhile is not None and not done.exists():
        meanwhile()
    with filelock.FileLock(root / f"{name}.lock"):
        if not done.exists():
            make(path)
            done.touch()
    return path
