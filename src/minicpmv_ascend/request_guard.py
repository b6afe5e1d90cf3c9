"""Alias of minicpmv_ascend.server.request_guard, where the module moved (issue 22: the in-server layer's folder).

This module IS that one (it replaces itself in sys.modules), so patching and isinstance see one
object, and the old path still works: `--middleware minicpmv_ascend.request_guard.RequestGuard` in an operator's own
`vllm serve`.
Nothing else belongs here (tests/test_architecture.py); the kit's own code imports the new path.
"""

import sys

from minicpmv_ascend.server import request_guard

sys.modules[__name__] = request_guard
