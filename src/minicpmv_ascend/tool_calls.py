"""Alias of minicpmv_ascend.server.tool_calls, where the module moved (issue 22: the in-server layer's folder).

This module IS that one (it replaces itself in sys.modules), so patching and isinstance see one
object, and the old path still works: `--middleware minicpmv_ascend.tool_calls.ToolCallGuard` in an operator's own
`vllm serve`.
Nothing else belongs here (tests/test_architecture.py); the kit's own code imports the new path.
"""

import sys

from minicpmv_ascend.server import tool_calls

sys.modules[__name__] = tool_calls
