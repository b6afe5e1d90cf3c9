"""Alias of minicpmv_ascend.server.access, where the module moved (issue 22: the in-server layer's folder).

This module IS that one (it replaces itself in sys.modules), so patching and isinstance see one
object, and the old path still works: `--middleware minicpmv_ascend.access.AccessControl` (or
`...AccessControlWithAdminRoutes`) in an operator's own `vllm serve` (docs/reliability.md), and
`python -m minicpmv_ascend.access --markdown`.
Nothing else belongs here (tests/test_architecture.py); the kit's own code imports the new path.
"""

import sys

from minicpmv_ascend.server import access

if __name__ == "__main__":  # python -m minicpmv_ascend.access
    sys.exit(access.main())
sys.modules[__name__] = access
