"""What the tests share that is not a fixture: the repository's path, the server helpers, the image
maker, the raw HTTP helper, the launcher and deploy helpers, the hostile media hosts, the
application-framework client and the test data the generated doc tables are made from.

Importable as `support` wherever pytest runs from the repository root: pyproject.toml's
[tool.pytest.ini_options] `pythonpath` puts tests/ (and plugin/tests/, scripts/) on sys.path once,
for `tests/` under .venv and `plugin/tests` under the target venvs alike. Fixtures and hooks stay
in tests/conftest.py; the test tiers' plugin stays in tests/tiers.py.
"""

from __future__ import annotations

import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
