"""`python -m minicpmv_ascend.settings --markdown`: the configuration reference table; `--describe [KEY ...]`: each setting in full."""

import sys

from minicpmv_ascend.settings.docs import main

sys.exit(main())
