"""Who may call which route of vLLM's API server: the API key on every route except a short public
list, and vLLM's admin and scaling routes off unless `enable_admin_routes` is set.

Why: vLLM's own key check (`--api-key` / `VLLM_API_KEY`, its `AuthenticationMiddleware` in 0.23,
0.30 and 0.32) guards only paths that START with /v1, /v2, /inference (and /cohere since 0.30).
Every other route answers without a key: `POST /invocations` (SageMaker's route, which vLLM
always serves) runs a chat completion, and /tokenize, /detokenize, /generative_scoring, /version,
/openapi.json, /load, /kv_event_sources and the elastic-scaling admin route /scale_elastic_ep are
open too. Upstream: vllm-project/vllm#58144 (the /invocations bypass, open),
vllm-project/vllm#18892 (other routes); vLLM's security guide documents the limitation
(vllm-project/vllm#29922); a deny-by-default fix is proposed in vllm-project/vllm#58028 (unmerged).

How: `AccessControl` is a dependency-free ASGI middleware that the launcher hands to vLLM through
vLLM's own `--middleware` option (the same option, with the same meaning, in 0.23, 0.30 and 0.32:
vLLM adds it after its CORS and key middleware, so it sees every request first, before routing).
For each HTTP or WebSocket request:

1. The path is the one the router matches (Starlette's rule for `root_path`), compared EXACTLY:
   no prefixes, no normalisation. Only a request whose method and path are one of PUBLIC_ROUTES
   passes without a key; `//health`, `/health/`, `/HEALTH`, `/metrics/x` are not public.
   A CORS preflight (OPTIONS with Origin and Access-Control-Request-Method) passes as well, as in
   vLLM: vLLM's CORS middleware answers it itself, no route runs.
2. When a key is configured (vLLM's rule: `--api-key`, else `VLLM_API_KEY`), every other request
   needs `Authorization: Bearer <key>`; without it: 401 `{"error": "Unauthorized"}` (vLLM's
   answer), a WebSocket is closed (1008) before it is accepted.
3. ADMIN_ROUTES answer 403 with a message naming the setting, unless `enable_admin_routes` is on
   (then they need the key like every other route). Without a key the 401 comes first: a caller
   without the key learns nothing about them.

Delete when: vLLM's key check denies by default (vllm-project/vllm#58028) AND keeps /metrics and
/health open, and vLLM has a switch for its admin routes; until then this is the kit's only
access control. The declarations below are the single source of the docs' tables
(`python -m minicpmv_ascend.server.access --markdown`) and of the tests' route classification.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import secrets
import sys
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

SETTING = "enable_admin_routes"
SETTING_ENV = "ENABLE_ADMIN_ROUTES"


@dataclasses.dataclass(frozen=True)
class PublicRoute:
    path: str
    methods: tuple[str, ...]
    why: str  # why answering it without the key is safe


@dataclasses.dataclass(frozen=True)
class AdminRoutes:
    paths: tuple[str, ...]  # FastAPI path templates: {name} is one path segment
    what: str
    registered: str  # when vLLM serves them at all


PUBLIC_ROUTES: tuple[PublicRoute, ...] = (
    PublicRoute("/health", ("GET",),
                "liveness: Docker's HEALTHCHECK and the Kubernetes probes (`probe.py live`) must not "
                "depend on the secret; it answers 200 or 503 with an empty body"),
    PublicRoute("/ping", ("GET", "POST"),
                "SageMaker's name for /health: vLLM runs the same handler, same empty answer"),
    PublicRoute("/metrics", ("GET",),
                "Prometheus scrapes it without a key (deploy/k8s ServiceMonitor): request counts, "
                "latencies, token and cache counters, the served model's name; no request content. "
                "Only the exact path: `/metrics/...` needs the key"),
)

ADMIN_ROUTES: tuple[AdminRoutes, ...] = (
    AdminRoutes(("/scale_elastic_ep", "/is_scaling_elastic_ep"),
                "elastic expert-parallel scaling: changes the data-parallel size and drains requests",
                "always (generate models)"),
    AdminRoutes(("/load", "/kv_event_sources"),
                "hints for load- and KV-cache-aware request routers (none in this kit); "
                "`/kv_event_sources` lists the engine's internal event endpoints",
                "always (`/kv_event_sources` since 0.32)"),
    AdminRoutes(("/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache", "/collective_rpc",
                 "/server_info", "/sleep", "/wake_up", "/is_sleeping", "/release_kv_cache_memory"),
                "development routes: cache resets, RPC into the workers, sleep mode, the full config",
                "`VLLM_SERVER_DEV_MODE=1`"),
    AdminRoutes(("/pause", "/resume", "/is_paused", "/abort_requests", "/get_world_size",
                 "/init_weight_transfer_engine", "/shutdown_weight_transfer_engine",
                 "/start_weight_update", "/start_draft_weight_update", "/update_weights",
                 "/finish_weight_update", "/update_weight_version", "/weight_info", "/weight_checker"),
                "reinforcement-learning control: pause generation, abort any request, replace weights",
                "`VLLM_SERVER_DEV_MODE=1` (`/abort_requests` also with `--tokens-only`)"),
    AdminRoutes(("/start_profile", "/stop_profile"), "the profiler", "`--profiler-config`"),
    AdminRoutes(("/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/adapters", "/adapters/{adapter_name}"),
                "load and unload LoRA adapters at run time (`/adapters` is SageMaker's spelling)",
                "`VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`"),
    AdminRoutes(("/fault_tolerance/apply", "/fault_tolerance/status"), "fault-tolerance control",
                "`--enable-fault-tolerance` (0.30+)"),
    AdminRoutes(("/inference/v1/abort_requests",), "abort any request (scale-out)",
                "always, a 403 stub unless `--enable-scale-out` (0.32)"),
    AdminRoutes(("/inference/v1/generate",),
                "token-in, token-out generation for disaggregated serving: token ids and multimodal "
                "features as the caller gives them (vLLM advisories GHSA-ph72-cqr5-qpp7, "
                "GHSA-4xqp-c3mv-qff7: an engine crash, a stalled engine); no OpenAI client uses it",
                "always on 0.23 (`serve/disagg`); with `--enable-scale-out` on 0.30 and 0.32 (0.32: a 403 "
                "stub without it)"),
)

_ADMIN_PATTERNS = tuple(
    re.compile("^" + re.sub(r"\\\{[^/]*?\\\}", "[^/]+", re.escape(path)) + "$")
    for group in ADMIN_ROUTES for path in group.paths
)
_PUBLIC = {(method, route.path) for route in PUBLIC_ROUTES for method in route.methods}


def route_path(scope: Scope) -> str:
    """The path the router matches: Starlette's `get_route_path` (root_path removed)."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    if not root or not path.startswith(root):
        return path
    if path == root:
        return ""
    return path[len(root):] if path[len(root)] == "/" else path


def is_public(method: str, path: str) -> bool:
    return (method, path) in _PUBLIC


def is_admin(path: str) -> bool:
    return any(pattern.match(path) for pattern in _ADMIN_PATTERNS)


def admin_message(method: str, path: str) -> str:
    return (f"{method} {path} is one of vLLM's admin routes, which this deployment turns off: set "
            f"{SETTING_ENV}=true (YAML `{SETTING}: true`) to serve it; it then needs the API key")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def _send_json(send: Send, status: int, body: Any, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": data})


class AccessControl:
    """The ASGI middleware (module docstring); `enable_admin_routes` off."""

    admin_routes = False

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app
        self._keys: list[bytes] | None = None

    def keys(self, scope: Scope) -> list[bytes]:
        """SHA-256 digests of the accepted keys, found as vLLM finds them: `--api-key` (the app's
        `state.args`), else `VLLM_API_KEY`. Read once, at the first request."""
        if self._keys is None:
            state = getattr(scope.get("app"), "state", None)
            args = getattr(state, "args", None) if state is not None else None
            tokens = list(getattr(args, "api_key", None) or []) or [os.environ.get("VLLM_API_KEY", "")]
            self._keys = [_digest(token) for token in tokens if token]
        return self._keys

    def authorized(self, scope: Scope, keys: list[bytes]) -> bool:
        scheme, _, token = (_header(scope, b"authorization") or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        offered = _digest(token)
        match = False
        for key in keys:  # every key compared, in constant time: no timing hint
            match |= secrets.compare_digest(offered, key)
        return match

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)  # lifespan
            return
        method = scope.get("method", "GET") if scope["type"] == "http" else "WEBSOCKET"
        path = route_path(scope)
        preflight = (method == "OPTIONS" and _header(scope, b"origin") is not None
                     and _header(scope, b"access-control-request-method") is not None)
        if not (is_public(method, path) or preflight):
            keys = self.keys(scope)
            if keys and not self.authorized(scope, keys):
                await self._deny(scope, send, 401, {"error": "Unauthorized"}, [(b"www-authenticate", b"Bearer")])
                return
            if not self.admin_routes and is_admin(path):
                message = admin_message(method, path)
                await self._deny(scope, send, 403, {"error": {"message": message, "type": "PermissionDeniedError",
                                                              "param": None, "code": 403}})
                return
        await self.app(scope, receive, send)

    @staticmethod
    async def _deny(scope: Scope, send: Send, status: int, body: Any,
                    headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation, before accept
        else:
            await _send_json(send, status, body, headers)


class AccessControlWithAdminRoutes(AccessControl):
    """The same, with `enable_admin_routes` on: the admin routes are served (with the key)."""

    admin_routes = True


def middleware_path(admin_routes: bool) -> str:
    """What the launcher passes as vLLM's `--middleware` for the setting's value."""
    cls = AccessControlWithAdminRoutes if admin_routes else AccessControl
    return f"{__name__}.{cls.__name__}"


def markdown() -> str:
    """The two tables docs/reliability.md embeds (a test keeps them in sync)."""
    rows = ["| public route | methods | why it needs no key |", "|---|---|---|"]
    rows += [f"| `{r.path}` | {', '.join(r.methods)} | {r.why} |" for r in PUBLIC_ROUTES]
    rows += ["", f"| admin routes (403 unless `{SETTING}`) | what they do | vLLM serves them |", "|---|---|---|"]
    rows += [f"| {', '.join(f'`{p}`' for p in g.paths)} | {g.what} | {g.registered} |" for g in ADMIN_ROUTES]
    return "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the API server's public and admin routes")
    parser.add_argument("--markdown", action="store_true", help="print the tables of docs/reliability.md")
    if parser.parse_args(argv).markdown:
        sys.stdout.write(markdown())
    else:
        parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
