"""The kit's access control on vLLM 0.23's real FastAPI app (`build_app` of
`vllm.entrypoints.openai.api_server`, the app vllm-ascend 0.23 serves), route by route.

The launcher hands vLLM `--middleware minicpmv_ascend.access.AccessControl` (vLLM's own option;
not a plugin patch). Here 0.23's own frontend parser and app builder take it, with every optional
route family on, and each route is sent without a key, with a wrong key and with the key
(access_harness.py; FastAPI borrowed from the CPU venv as in serve_harness.py). The same runs on
vLLM 0.32's app in tests/test_access.py and live in tests/test_security.py.
"""

from __future__ import annotations

import sys

from access_harness import open_without_key, report_from


def test_every_route_of_vllm023s_app_needs_the_key_and_admin_routes_are_off(tmp_path):
    result = report_from(sys.executable, tmp_path)
    assert result["vllm"].startswith("0.23.")
    # The bug: vLLM 0.23 alone answers /invocations, /tokenize, the admin routes... without the key.
    open_routes = open_without_key(result["vllm alone"])
    assert {"POST /invocations", "POST /tokenize", "POST /scale_elastic_ep", "GET /openapi.json",
            "POST /sleep", "POST /collective_rpc"} <= open_routes, open_routes
    # The fix, with enable_admin_routes off and on.
    for setting in ("off", "on"):
        assert result[setting]["problems"] == [], (setting, result[setting]["problems"])
    kinds = result["off"]["kinds"]
    print(f"\nvLLM {result['vllm']} app: {sum(kinds.values())} (method, path) pairs: {kinds}; "
          f"without the access control {len(open_routes)} of them answer without the key")
    assert kinds == {"public": 4, "key": 26, "admin": 25}  # public: GET /health, GET+POST /ping, GET /metrics
