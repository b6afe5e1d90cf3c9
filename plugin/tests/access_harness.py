"""Every route of vLLM's real FastAPI app, sent through the kit's access control in-process.

The app comes from the running vLLM's own builder (`build_app`: 0.32's
`vllm.entrypoints.launchers.app`, 0.23's `vllm.entrypoints.openai.api_server`) and its own
frontend argument parser with `--middleware` as the launcher passes it, and with every optional
route family switched on (VLLM_SERVER_DEV_MODE, runtime LoRA, the profiler, scale-out, fault
tolerance, the tokenizer-info route), so that every admin route is there to be refused. Requests
go through Starlette's TestClient without the app's lifespan: no engine exists, so a handler that
runs fails on the missing engine (500) or on the empty body (4xx): "served", as opposed to 401 or
the access control's 403.

Used by tests/test_access.py (vLLM 0.32, .venv) and plugin/tests/server/test_target_access.py (each Ascend
target's vLLM: .venv-vllm030, .venv-vllm023, whose locks carry FastAPI, Starlette and httpx).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import sys
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[2]
KEY = "sk-access-harness-3b9d"
ROUTE_FAMILIES_ENV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}


def build(middleware: str | None, tmp: pathlib.Path) -> Any:
    """vLLM's own app, as `vllm serve` builds it (env: ROUTE_FAMILIES_ENV and VLLM_API_KEY set by
    the caller). `middleware`: the launcher's `--middleware` value, or None for vLLM alone."""
    from vllm.config import ProfilerConfig
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:  # vLLM >= 0.30
        from vllm.entrypoints.launchers.app import build_app
        from vllm.entrypoints.launchers.cli_args import FrontendArgs
    except ImportError:  # vLLM 0.23
        from vllm.entrypoints.openai.api_server import build_app  # type: ignore[no-redef]
        from vllm.entrypoints.openai.cli_args import FrontendArgs  # type: ignore[no-redef]

    flags = ["--enable-tokenizer-info-endpoint"] + (["--middleware", middleware] if middleware else [])
    parser = FrontendArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(flags)
    args.profiler_config = ProfilerConfig(profiler="torch", torch_profiler_dir=str(tmp))
    args.enable_scale_out = True  # 0.32's scale-out routes for real, not its 403 stubs
    args.enable_fault_tolerance = True  # 0.30+
    return build_app(args, supported_tasks=("generate",))


@dataclasses.dataclass
class Outcome:
    method: str
    path: str
    kind: str  # "public", "admin" or "key" (access.PUBLIC_ROUTES / ADMIN_ROUTES / everything else)
    no_key: int
    wrong_key: int
    with_key: int
    with_key_body: str


def routes(app: Any) -> list[tuple[str, str]]:
    """(method, path) of every route the app serves; {params} filled in. Mounts: GET."""
    found = set()
    for route in app.routes:
        path = getattr(route, "path", None)
        if path is None:
            continue
        path = re.sub(r"\{[^}]*\}", "x", path)
        for method in getattr(route, "methods", None) or {"GET"}:
            found.add((method, path))
    return sorted(found, key=lambda r: (r[1], r[0]))


def kind_of(method: str, path: str) -> str:
    from minicpmv_ascend.server import access

    if access.is_public(method, path):
        return "public"
    return "admin" if access.is_admin(path) else "key"


def send_all(app: Any) -> list[Outcome]:
    """Each route without a key, with a wrong key and with KEY (POST: an empty JSON object)."""
    from starlette.testclient import TestClient

    client = TestClient(app, raise_server_exceptions=False)  # no `with`: no lifespan, no engine

    def send(method: str, path: str, key: str | None) -> tuple[int, str]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        body = {"json": {}} if method in ("POST", "PUT", "PATCH") else {}
        response = client.request(method, path, headers=headers, follow_redirects=False, **body)
        return response.status_code, response.text

    outcomes = []
    for method, path in routes(app):
        with_key = send(method, path, KEY)
        outcomes.append(Outcome(method, path, kind_of(method, path), send(method, path, None)[0],
                                send(method, path, "sk-wrong")[0], *with_key))
    return outcomes


def problems(outcomes: list[Outcome], admin_routes: bool) -> list[str]:
    """What does not hold of the rules (minicpmv_ascend.server.access) for one app."""
    from minicpmv_ascend.server import access

    bad = []
    for o in outcomes:
        where = f"{o.method} {o.path} ({o.kind}: {o.no_key}/{o.wrong_key}/{o.with_key})"
        refused_by_us = o.with_key == 403 and access.SETTING_ENV in o.with_key_body
        if o.kind == "public":
            if o.no_key == 401:
                bad.append(f"{where}: public but refused without a key")
            continue
        if (o.no_key, o.wrong_key) != (401, 401):
            bad.append(f"{where}: served without the key")
        elif o.with_key == 401:
            bad.append(f"{where}: refused with the key")
        elif o.kind == "admin" and refused_by_us == admin_routes:
            bad.append(f"{where}: admin route {'refused' if admin_routes else 'served'} with "
                       f"{access.SETTING}={str(admin_routes).lower()}")
        elif o.kind == "key" and refused_by_us:
            bad.append(f"{where}: refused as an admin route")
    return bad



def report(tmp: pathlib.Path) -> dict[str, Any]:
    """vLLM alone and with each access-control class: the problems and the routes per kind.
    The caller sets ROUTE_FAMILIES_ENV and VLLM_API_KEY=KEY in the environment."""
    import vllm

    from minicpmv_ascend.server import access

    out: dict[str, Any] = {"vllm": vllm.__version__}
    for name, middleware, admin_routes in (("vllm alone", None, False), ("off", access.middleware_path(False), False),
                                           ("on", access.middleware_path(True), True)):
        app = build(middleware, tmp)
        outcomes = send_all(app)
        kinds = {kind: sum(o.kind == kind for o in outcomes) for kind in ("public", "key", "admin")}
        out[name] = {"problems": problems(outcomes, admin_routes), "kinds": kinds,
                     "paths": sorted({getattr(r, "path", "") for r in app.routes})}
    return out


def open_without_key(result: dict[str, Any]) -> set[str]:
    """'METHOD /path' of the routes one report() entry served without the key."""
    return {p.split(" (")[0] for p in result["problems"] if "served without the key" in p}


def report_from(python: str, tmp: pathlib.Path, timeout: float = 600) -> dict[str, Any]:
    """report() of a venv's vLLM, run by its interpreter in a fresh process with this checkout's
    `minicpmv_ascend`."""
    import json
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS" and not k.startswith(("MINICPMV_", "VLLM_"))}
    env |= {**ROUTE_FAMILIES_ENV, "VLLM_API_KEY": KEY, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([python, __file__, str(tmp)], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])


if __name__ == "__main__":  # `python access_harness.py TMPDIR`: see report_from()
    import json
    import logging

    logging.disable(logging.ERROR)  # vLLM logs every handler that fails for the missing engine
    print("RESULT " + json.dumps(report(pathlib.Path(sys.argv[1]))), flush=True)
