#!/usr/bin/env python3
"""Health probe called by path from the container, compose and Kubernetes.

    python healthcheck/probe.py live|ready|smoke [options]    (--help for the options)

A thin shim over `minicpmv_ascend.probes` (also installed as `minicpmv-probe`). From a source
checkout where the package is not installed, it imports the package from the repo's src/.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from minicpmv_ascend.probes import main
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from minicpmv_ascend.probes import main

if __name__ == "__main__":
    sys.exit(main())
