#!/usr/bin/env python3
"""Health probe called by path from the container, compose and Kubernetes.

    python healthcheck/probe.py live|ready|smoke [options]    (--help for the options)

A thin shim over `minicpmv_ascend.probes` (also installed as `minicpmv-probe`). From a source
checkout where the package is not installed, it imports the package from the repo's src/.
Runs on the host too: Python 3.7 or newer, standard library only. This file itself parses on any
Python 3, so an older interpreter gets a usage error (exit 2), never a traceback that an
orchestrator would read as "unhealthy" (exit 1).
"""

import sys
from pathlib import Path

MIN_PYTHON = (3, 7)

if __name__ == "__main__" and sys.version_info < MIN_PYTHON:
    sys.stderr.write("minicpmv-probe: error: needs Python %d.%d or newer, this is %s (%s)\n"
                     % (MIN_PYTHON + (sys.version.split()[0], sys.executable)))
    sys.exit(2)

try:
    from minicpmv_ascend.probes import main
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from minicpmv_ascend.probes import main

if __name__ == "__main__":
    sys.exit(main())
