"""The kit's access control on the target's real FastAPI app (`build_app`: 0.23's
`vllm.entrypoints.openai.api_server`, 0.30's `vllm.entrypoints.launchers.app`; the app
vllm-ascend of that release serves), route by route.

The launcher hands vLLM `--middleware minicpmv_ascend.server.access.AccessControl` (vLLM's own option;
not a plugin patch). Here the target's own frontend parser and app builder take it, with every
optional route family on, and each route is sent without a key, with a wrong key and with the key
(access_harness.py, in a fresh process of this venv). The same runs on vLLM 0.32's app in
tests/test_access.py and live in tests/test_security.py.
"""

from __future__ import annotations

import sys

from access_harness import open_without_key, report_from

# (method, path) pairs of each target's app with every optional route family on, by kind.
# public: GET /health, GET and POST /ping, GET /metrics.
KINDS = {"0.23.0": {"public": 4, "key": 25, "admin": 26}, "0.30.0": {"public": 4, "key": 29, "admin": 32}}


def test_every_route_of_the_targets_app_needs_the_key_and_admin_routes_are_off(target, tmp_path):
    result = report_from(sys.executable, tmp_path)
    assert result["vllm"] == target.vllm
    # The bug: vLLM alone answers /invocations, /tokenize, the admin routes... without the key
    # (its key check guards only the /v1-style prefixes).
    open_routes = open_without_key(result["vllm alone"])
    assert {"POST /invocations", "POST /tokenize", "POST /scale_elastic_ep", "GET /openapi.json",
            "POST /sleep", "POST /collective_rpc"} <= open_routes, open_routes
    # The fix, with enable_admin_routes off and on.
    for setting in ("off", "on"):
        assert result[setting]["problems"] == [], (setting, result[setting]["problems"])
    kinds = result["off"]["kinds"]
    print(f"\nvLLM {result['vllm']} app: {sum(kinds.values())} (method, path) pairs: {kinds}; "
          f"without the access control {len(open_routes)} of them answer without the key")
    assert kinds == KINDS[target.vllm]
