#!/usr/bin/env python3
"""Container entrypoint: validate the serving configuration, then exec vLLM in this process.

A thin shim (containers and orchestrators call it by path); the logic is
`minicpmv_ascend.launcher`. Works installed and from a source checkout.
"""

import importlib.util
import pathlib
import sys

if importlib.util.find_spec("minicpmv_ascend") is None:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "src"))

from minicpmv_ascend.launcher import main

main()
