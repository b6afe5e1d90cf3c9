"""Alias of minicpmv_ascend.server.media_urls, where the module moved (issue 22: the in-server layer's folder).

This module IS that one (it replaces itself in sys.modules), so patching and isinstance see one
object, and the old path still works: `from minicpmv_ascend import media_urls` in code written against the old layout.
Nothing else belongs here (tests/test_architecture.py); the kit's own code imports the new path.
"""

import sys

from minicpmv_ascend.server import media_urls

sys.modules[__name__] = media_urls
