"""The access control (minicpmv_ascend.server.access) without a server: its rules on hand-made ASGI
requests, every route of vLLM 0.32's real app, the facts it relies on in vLLM 0.23, 0.30 and
0.32's source, the launcher's flag and the generated docs.

The live proof (the running server's /openapi.json, route by route, and path tricks over real
HTTP) is in tests/test_security.py; the Ascend targets' real apps (vLLM 0.30 and 0.23, each in its
own venv) in plugin/tests/server/test_target_access.py.
"""

from __future__ import annotations

import ast
import asyncio
import os
import pathlib
import re
import subprocess
import sys
import sysconfig
from typing import Any

import pytest

import access_harness
from minicpmv_ascend import settings
from minicpmv_ascend.server import access
from support.server import REPO

KEY = "sk-access-unit"


# --------------------------------------------------------------------------------------------
# The rules, on hand-made ASGI requests (no vLLM, no Starlette)
# --------------------------------------------------------------------------------------------


class Args:
    api_key: list[str] | None = None


class App:
    """What Starlette puts in scope["app"]: vLLM keeps its parsed args in app.state.args."""

    def __init__(self, api_key: list[str] | None = None) -> None:
        self.state = type("State", (), {"args": Args()})()
        self.state.args.api_key = api_key


def call(middleware: access.AccessControl, method: str, path: str, key: str | None = None,
         kind: str = "http", app: App | None = None, root_path: str = "",
         headers: dict[str, str] | None = None) -> tuple[int | str, bool]:
    """(status, or 'close CODE' for a WebSocket; whether the inner app ran)."""
    reached: list[bool] = []
    sent: list[dict[str, Any]] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        reached.append(True)
        if kind == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    middleware.app = inner
    raw = {"authorization": f"Bearer {key}"} if key else {}
    raw |= headers or {}
    scope = {"type": kind, "path": path, "root_path": root_path, "app": app or App(),
             "headers": [(k.encode(), v.encode()) for k, v in raw.items()]}
    if kind == "http":
        scope["method"] = method
    asyncio.run(middleware(scope, receive, send))
    if kind == "websocket":
        return (f"close {sent[0]['code']}" if sent else "accepted"), bool(reached)
    return sent[0]["status"], bool(reached)


@pytest.fixture
def guard(monkeypatch) -> access.AccessControl:
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    return access.AccessControl(None)


# Spellings a prefix check or a sloppy comparison lets through; each must need the key.
TRICKS = [
    ("POST", "/invocations"), ("POST", "//v1/chat/completions"), ("POST", "/V1/chat/completions"),
    ("POST", "/health/../invocations"), ("POST", "/invocations/"), ("GET", "/health/"), ("GET", "//health"),
    ("GET", "/HEALTH"), ("GET", "/health "), ("GET", "/metrics/"), ("GET", "/metrics/../v1/models"),
    ("POST", "/health"), ("HEAD", "/health"), ("DELETE", "/ping"), ("GET", ""), ("GET", "/"),
    ("OPTIONS", "/v1/chat/completions"), ("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/version"),
]


def test_only_the_exact_public_routes_pass_without_the_key(guard) -> None:
    for route in access.PUBLIC_ROUTES:
        for method in route.methods:
            assert call(guard, method, route.path) == (200, True), (method, route.path)
    for method, path in TRICKS:
        assert call(guard, method, path) == (401, False), (method, path)
        assert call(guard, method, path, "sk-wrong") == (401, False), (method, path)
        assert call(guard, method, path, KEY.upper()) == (401, False), (method, path)
        assert call(guard, method, path, KEY)[1], (method, path)  # with the key: to the router


def test_the_path_is_the_one_the_router_sees(guard) -> None:
    """Starlette's root_path rule: /api/health under root_path /api is /health, /apihealth is not."""
    assert access.route_path({"path": "/api/health", "root_path": "/api"}) == "/health"
    assert access.route_path({"path": "/apihealth", "root_path": "/api"}) == "/apihealth"
    assert access.route_path({"path": "/health", "root_path": "/api"}) == "/health"
    assert call(guard, "GET", "/api/health", root_path="/api") == (200, True)
    assert call(guard, "GET", "/apihealth", root_path="/api") == (401, False)


def test_cors_preflight_passes_other_options_need_the_key(guard) -> None:
    preflight = {"origin": "https://example.com", "access-control-request-method": "POST"}
    assert call(guard, "OPTIONS", "/invocations", headers=preflight) == (200, True)
    assert call(guard, "OPTIONS", "/invocations", headers={"origin": "https://example.com"}) == (401, False)


def test_websockets_need_the_key(guard) -> None:
    assert call(guard, "", "/v1/realtime", kind="websocket") == ("close 1008", False)
    assert call(guard, "", "/v1/realtime", KEY, kind="websocket") == ("accepted", True)


def test_admin_routes_are_refused_after_the_key_check(guard, monkeypatch) -> None:
    for path in ("/scale_elastic_ep", "/load", "/adapters/some-lora", "/sleep"):
        assert call(guard, "POST", path) == (401, False)  # no hint to a caller without the key
        assert call(guard, "POST", path, KEY) == (403, False)
        assert call(access.AccessControlWithAdminRoutes(None), "POST", path, KEY) == (200, True)
    assert call(guard, "POST", "/adapters/a/b", KEY) == (200, True)  # {adapter_name}: one segment
    monkeypatch.delenv("VLLM_API_KEY")  # no key configured: everything open but the admin routes
    assert call(access.AccessControl(None), "POST", "/invocations") == (200, True)
    assert call(access.AccessControl(None), "POST", "/scale_elastic_ep") == (403, False)


def test_keys_are_found_as_vllm_finds_them(monkeypatch) -> None:
    """`--api-key` (app.state.args.api_key, several allowed) before VLLM_API_KEY, as vLLM does."""
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    app = App(api_key=["first", "second"])
    for key, status in (("first", 200), ("second", 200), ("from-env", 401)):
        assert call(access.AccessControl(None), "POST", "/invocations", key, app=app)[0] == status
    assert call(access.AccessControl(None), "POST", "/invocations", "from-env")[0] == 200
    scheme = {"authorization": f"Basic {KEY}"}
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    assert call(access.AccessControl(None), "POST", "/invocations", headers=scheme)[0] == 401


def test_no_public_route_is_an_admin_route() -> None:
    for route in access.PUBLIC_ROUTES:
        assert not access.is_admin(route.path)
        assert route.why and route.methods


# --------------------------------------------------------------------------------------------
# Every route of vLLM 0.32's real app (its build_app, no engine)
# --------------------------------------------------------------------------------------------


# (method, path) pairs of vLLM 0.32's app with every optional route family on, by kind (the
# targets': plugin/tests/server/test_target_access.py).
KINDS = {"public": 4, "key": 30, "admin": 37}


@pytest.mark.slow
def test_every_route_of_vllms_app_needs_the_key_and_admin_routes_are_off(tmp_path) -> None:
    """vLLM 0.32's own build_app, every route without / with a wrong / with the key (access_harness)."""
    result = access_harness.report_from(sys.executable, tmp_path)
    assert result["vllm"].startswith("0.32.")
    # The bug: vLLM's key check guards only /v1, /v2, /inference and /cohere.
    open_routes = access_harness.open_without_key(result["vllm alone"])
    assert {"POST /invocations", "POST /tokenize", "POST /scale_elastic_ep", "GET /openapi.json",
            "POST /sleep", "POST /collective_rpc", "GET /load"} <= open_routes, open_routes
    for setting in ("off", "on"):  # the fix, with enable_admin_routes off and on
        assert result[setting]["problems"] == [], (setting, result[setting]["problems"])
    kinds = result["off"]["kinds"]
    print(f"\nvLLM {result['vllm']} app: {sum(kinds.values())} (method, path) pairs: {kinds}; "
          f"without the access control {len(open_routes)} of them answer without the key")
    assert kinds == KINDS  # public: GET /health, GET and POST /ping, GET /metrics
    # No stale declaration: 0.32 has every declared admin route.
    assert {p for g in access.ADMIN_ROUTES for p in g.paths} - set(result["off"]["paths"]) == set()
    assert kinds["admin"] == sum(len(g.paths) for g in access.ADMIN_ROUTES)


# --------------------------------------------------------------------------------------------
# What the mechanism relies on, in each target vLLM's source
# --------------------------------------------------------------------------------------------


def vllm_trees() -> list[Any]:
    """vLLM 0.23 (.venv-vllm023), 0.30 (.venv-vllm030, or VLLM030_SOURCE: a directory holding the
    `vllm` package of the 0.30.0 wheel, e.g. `pip download vllm==0.30.0 --no-deps -d W && unzip -q
    W/*.whl 'vllm/*' -d DIR`) and 0.32 (this venv)."""
    def site(venv: str) -> list[pathlib.Path]:  # the venv's vLLM, whichever Python (3.11, 3.12) it has
        return sorted((REPO / venv).glob("lib/python3.*/site-packages/vllm")) or [REPO / venv / "lib"]

    trees = {"0.23.0": site(".venv-vllm023"),
             "0.30.0": site(".venv-vllm030") + ([pathlib.Path(os.environ["VLLM030_SOURCE"]) / "vllm"]
                                                if os.environ.get("VLLM030_SOURCE") else []),
             "0.32.0": [pathlib.Path(sysconfig.get_paths()["purelib"]) / "vllm"]}
    params = []
    for version, candidates in trees.items():
        found = next((c for c in candidates if (c / "entrypoints").is_dir()), None)
        params.append(pytest.param(version, found, id=version, marks=[] if found else pytest.mark.skip(
            reason=f"no vLLM {version} source here ({', '.join(map(str, candidates))})")))
    return params


def source_defining(tree: pathlib.Path, pattern: str) -> tuple[str, str]:
    """(path, text) of the one file under vllm/entrypoints that matches `pattern`."""
    hits = [(p, p.read_text()) for p in sorted((tree / "entrypoints").rglob("*.py"))]
    hits = [(str(p.relative_to(tree)), text) for p, text in hits if re.search(pattern, text, re.M)]
    assert len(hits) == 1, f"{pattern!r} in {[h[0] for h in hits]}"
    return hits[0]


@pytest.mark.parametrize(("version", "tree"), vllm_trees())
def test_target_vllm_guards_only_prefixes_and_applies_middleware_last(version, tree) -> None:
    assert re.search(rf"version = '{re.escape(version)}'", (tree / "_version.py").read_text())
    # 1. The hole: the key check is a prefix test that /invocations and /tokenize do not match.
    checker, auth = source_defining(tree, r"^class AuthenticationMiddleware\b")
    prefixes = next(ast.literal_eval(node.value) for node in ast.walk(ast.parse(auth))
                    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "GUARDED_PREFIX")
    assert "url_path.startswith(GUARDED_PREFIX)" in auth, checker
    for path in ("/invocations", "/tokenize", "/scale_elastic_ep", "/openapi.json"):
        assert not path.startswith(prefixes), (version, path, prefixes)
    # 2. `--middleware` is appended, and each is added after vLLM's key and CORS middleware, i.e.
    #    outermost (Starlette's add_middleware puts the newest first): it sees requests first.
    where, builder = source_defining(tree, r"^\s+for middleware in args\.middleware:")
    loop = builder.index("for middleware in args.middleware:")
    assert builder.index("AuthenticationMiddleware, tokens=tokens)") < loop, where
    assert builder.index("CORSMiddleware,") < loop, where
    assert "app.add_middleware(imported)" in builder[loop:], where
    where, cli = source_defining(tree, r"^    middleware: list\[str\]")
    assert 'frontend_kwargs["middleware"]["action"] = "append"' in cli, where
    print(f"\nvLLM {version}: key check in {checker}: prefixes {prefixes}; --middleware applied last")


# --------------------------------------------------------------------------------------------
# The launcher and the docs
# --------------------------------------------------------------------------------------------


def test_the_launcher_always_passes_the_access_control(tiny_config, tmp_path) -> None:
    def middleware(env: dict[str, str], args: tuple[str, ...] = (), config: pathlib.Path | None = None) -> list[str]:
        env = {"MODEL_PATH": str(tiny_config), **env}
        plan = settings.build_plan(settings.resolve(list(args), env, config), env, "cpu")
        return [plan.vllm_args[i + 1] for i, a in enumerate(plan.vllm_args) if a == "--middleware"]

    guard = "minicpmv_ascend.server.tool_calls.ToolCallGuard"  # with tool calling (on by default), inside it
    request_guard = "minicpmv_ascend.server.request_guard.RequestGuard"  # always, between the two
    assert middleware({}) == [guard, request_guard, "minicpmv_ascend.server.access.AccessControl"]
    assert middleware({"ENABLE_AUTO_TOOL_CHOICE": "false"}) == [request_guard, "minicpmv_ascend.server.access.AccessControl"]
    on = [guard, request_guard, "minicpmv_ascend.server.access.AccessControlWithAdminRoutes"]
    assert middleware({"ENABLE_ADMIN_ROUTES": "true"}) == on
    (tmp_path / "serve.yaml").write_text("enable_admin_routes: true\n")
    assert middleware({}, config=tmp_path / "serve.yaml") == on
    # An operator's own --middleware goes to vLLM too; it does not replace the access control.
    assert middleware({}, ("--middleware", "my.Middleware")) == [guard, request_guard,
                                                                  "minicpmv_ascend.server.access.AccessControl",
                                                                  "my.Middleware"]
    for path in (access.middleware_path(False), access.middleware_path(True)):
        module, _, name = path.rpartition(".")
        assert getattr(__import__(module, fromlist=[name]), name)  # importable as vLLM imports it


def test_a_wrong_admin_setting_is_a_configuration_error(tiny_config) -> None:
    with pytest.raises(settings.ConfigError) as err:
        settings.resolve([], {"ENABLE_ADMIN_ROUTES": "maybe"})
    assert err.value.key == "enable_admin_routes" and "boolean" in err.value.why


def test_access_markdown_command_prints_the_route_tables() -> None:
    """`python -m minicpmv_ascend.server.access --markdown` prints access.markdown(), the route tables of
    docs/reliability.md (tests/test_doc_tables.py keeps the doc equal to it)."""
    out = subprocess.run([sys.executable, "-m", "minicpmv_ascend.server.access", "--markdown"], capture_output=True,
                         text=True, check=True).stdout
    assert out == access.markdown() and out.strip()


