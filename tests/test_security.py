"""Security, tried for real: the API key on every route, server-side media fetching (SSRF) and
the container's privileges.

- `guarded`: the second shared server (tests/conftest.py `other_server`), with the media URL
  defaults (fetching image URLs off), the API key from a file (as a mounted Kubernetes/Docker
  secret) and one allowed local media directory (its other settings, prefix caching, 64-token
  chunks and trusted processor options, are the request sweep's and the parity run's). The API-key
  proofs (route by route from its live /openapi.json and route list, and path tricks over raw
  HTTP) and "off by default" run against it.
- the shared `server` (tests/conftest.py) runs `ALLOWED_MEDIA_DOMAINS=public,127.0.0.1`: image
  URLs from public addresses, and one loopback host listed explicitly (the image-URL examples): the
  public-only refusals run against it, for real; the public decision itself is tested on addresses
  (no public address is reachable from this machine).
- the deployment files (compose.yaml, the rendered Kubernetes manifests) are read, not run.

Image hosts are loopback HTTP servers that count the requests they get: "refused" means a 4xx
*and* no request reached the host.
"""

from __future__ import annotations

import base64
import concurrent.futures
import http.client
import http.server
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from minicpmv_ascend import settings
from minicpmv_ascend.server import access
from support import raw_http
from support.deploy import (
    JOB_TEMPLATES,
    OVERLAYS,
    env_mapping,
    one,
    pod_templates,
    server_container,
)
from support.images import png_bytes, png_claiming, video_frames_url
from support.launcher import launcher_env, run_entrypoint
from support.server import OTHER_SERVER_KEY, REPO, clean_env
from support.slow_hosts import SLOW_PATHS, SlowHost

SECRET = OTHER_SERVER_KEY
PROBE = REPO / "healthcheck" / "probe.py"


def request(base_url: str, path: str, body: dict | None = None, key: str | None = None,
            timeout: float = 120) -> tuple[int, str]:
    status, answer = raw_http.send(base_url + path, body, key=key, timeout=timeout)
    return status, answer.decode()


def image_chat(server: Any, url: str, key: str | None = None, kind: str = "image_url") -> tuple[int, str]:
    body = {"model": server.model, "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is in the picture?"}, {"type": kind, kind: {"url": url}}]}]}
    return request(server.base_url, "/v1/chat/completions", body, key)


class ImageHost:
    """A loopback HTTP server (IPv4 and IPv6: 127.0.0.1, ::1 and localhost all reach it) that serves
    one PNG (or a redirect) and records every request."""

    def __init__(self, redirect_to: str | None = None) -> None:
        self.requests: list[str] = []
        host = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                host.requests.append(self.path)
                if redirect_to:
                    self.send_response(302)
                    self.send_header("Location", redirect_to)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = png_bytes(64, 48, (200, 40, 40))
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        class DualStack(http.server.ThreadingHTTPServer):
            address_family = socket.AF_INET6

            def server_bind(self) -> None:
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                super().server_bind()

        self.httpd = DualStack(("::", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def image_host() -> Iterator[ImageHost]:
    host = ImageHost()
    yield host
    host.close()


@pytest.fixture(scope="module")
def files(other_server_files) -> pathlib.Path:
    """The guarded server's key file and media directory, a picture in it and one outside of it."""
    (other_server_files / "media" / "red.png").write_bytes(png_bytes(64, 48, (200, 40, 40)))
    (other_server_files / "outside").mkdir(exist_ok=True)
    (other_server_files / "outside" / "blue.png").write_bytes(png_bytes(64, 48, (40, 40, 200)))
    return other_server_files


@pytest.fixture
def guarded(other_server):
    """Media URL settings at their defaults, one local directory, the key from a file."""
    return other_server


# --------------------------------------------------------------------------------------------
# The API key
# --------------------------------------------------------------------------------------------


@pytest.mark.server
def test_requests_without_the_key_get_401(guarded) -> None:
    chat = {"model": guarded.model, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
    for key in (None, "sk-wrong"):
        assert request(guarded.base_url, "/v1/models", key=key)[0] == 401
        assert request(guarded.base_url, "/v1/chat/completions", chat, key=key)[0] == 401
    assert request(guarded.base_url, "/v1/chat/completions", chat, key=SECRET)[0] == 200
    # /health needs no key: liveness must not depend on the secret (vLLM exempts it).
    assert request(guarded.base_url, "/health")[0] == 200


@pytest.mark.server
def test_probes_send_the_key_from_the_secret_file(guarded, files) -> None:
    env = clean_env(PORT=str(guarded.port), SERVED_MODEL_NAME=guarded.model)
    for with_key in ({}, {"API_KEY_FILE": str(files / "api-key")}):  # liveness needs no key
        live = subprocess.run([sys.executable, str(PROBE), "live"], capture_output=True, text=True, timeout=60,
                              env={**env, **with_key})
        assert live.returncode == 0, live.stderr
    for mode in ("ready", "smoke"):
        ok = subprocess.run([sys.executable, str(PROBE), mode], capture_output=True, text=True, timeout=180,
                            env={**env, "API_KEY_FILE": str(files / "api-key")})
        assert ok.returncode == 0, ok.stderr
        without = subprocess.run([sys.executable, str(PROBE), mode], capture_output=True, text=True,
                                 timeout=180, env=env)
        assert without.returncode == 1 and "401" in without.stderr, without.stderr
        assert SECRET not in ok.stdout + ok.stderr + without.stdout + without.stderr


@pytest.mark.server
def test_ascend_check_sends_the_key_from_the_secret_file(guarded, files) -> None:
    """scripts/ascend_check.py reads the key as the server does (API_KEY_FILE here): its requests
    (the probe's smoke, then the one-token completion) pass; without the key they get 401."""
    script = [sys.executable, str(REPO / "scripts" / "ascend_check.py"), "--base-url", guarded.base_url]
    env = clean_env(HF_HUB_OFFLINE="1")
    ok = subprocess.run(script, capture_output=True, text=True, timeout=300, cwd=REPO,
                        env={**env, "API_KEY_FILE": str(files / "api-key")})
    assert ok.returncode == 0, ok.stdout + ok.stderr[-2000:]
    requests = [line for line in ok.stdout.splitlines() if line.startswith("request ")]
    assert [line.split(" - ")[0] for line in requests] == ["request text: ok", "request image: ok",
                                                          "request one-token: ok"], requests
    without = subprocess.run(script, capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert without.returncode == 1 and "request text: FAILED - cannot list models" in without.stdout
    assert "HTTP 401" in without.stdout, without.stdout
    bad = subprocess.run(script, capture_output=True, text=True, timeout=300, cwd=REPO,
                         env={**env, "API_KEY_FILE": str(files / "absent")})
    assert bad.returncode == 2 and "the key file cannot be read" in bad.stderr, bad.stderr
    assert SECRET not in ok.stdout + ok.stderr + without.stdout + bad.stdout + bad.stderr


# Every route of the running server, as vLLM 0.32 publishes it for this kit (generate task, no dev
# mode): those that serve or inspect the model. Public routes (access.PUBLIC_ROUTES) and admin
# routes (access.ADMIN_ROUTES) come from the code; a route in neither and not here fails the test.
NEEDS_KEY: dict[str, tuple[str, ...]] = {
    "/v1/chat/completions": ("POST",), "/v1/completions": ("POST",), "/v1/models": ("GET",),
    "/v1/chat/completions/batch": ("POST",), "/v1/responses": ("POST",),
    "/v1/responses/{response_id}": ("GET",), "/v1/responses/{response_id}/cancel": ("POST",),
    "/v1/messages": ("POST",), "/v1/messages/count_tokens": ("POST",), "/v1/systemone": ("POST",),
    "/invocations": ("POST",),  # SageMaker's inference route: the same handlers as /v1
    "/tokenize": ("POST",), "/detokenize": ("POST",), "/generative_scoring": ("POST",),
    "/version": ("GET",),  # which vLLM, hence which of its CVEs: not for anonymous callers
    # The API schema and its pages: a map of every route; operators fetch it with the key.
    "/openapi.json": ("GET", "HEAD"), "/docs": ("GET", "HEAD"), "/docs/oauth2-redirect": ("GET", "HEAD"),
    "/redoc": ("GET", "HEAD"),
    # Scale-out routes: 403 stubs from vLLM unless --enable-scale-out; not in the schema.
    "/v1/chat/completions/render": ("POST",), "/v1/completions/render": ("POST",),
    "/v1/messages/render": ("POST",), "/v1/responses/render": ("POST",),
    "/v1/chat/completions/derender": ("POST",), "/v1/completions/derender": ("POST",),
}


def raw_request(srv: Any, method: str, target: str, key: str | None = None, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """One request with the target sent byte for byte (no client-side normalisation)."""
    connection = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    try:
        sent = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
        connection.request(method, target, body=body if body is not None else (b"{}" if method == "POST" else None),
                           headers=sent | (headers or {}))
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def served_routes(srv: Any) -> set[tuple[str, str]]:
    """(method, path) of the live /openapi.json (read with the key) and of the route list vLLM
    logs at start (it also has the routes left out of the schema)."""
    status, body = raw_request(srv, "GET", "/openapi.json", SECRET)
    assert status == 200, body[:300]
    routes = {(method.upper(), path) for path, item in json.loads(body)["paths"].items() for method in item}
    logged = re.findall(r"Route: (\S+), Methods: ([A-Z, ]+)$", srv.log_path.read_text(errors="replace"), re.M)
    assert logged, "vLLM's 'Available routes' list is missing from the server log"
    routes |= {(method.strip(), path) for path, methods in logged for method in methods.split(",")}
    return routes


def kind_of(method: str, path: str) -> str | None:
    if access.is_public(method, path):
        return "public"
    if access.is_admin(path):
        return "admin"
    return "key" if method in NEEDS_KEY.get(path, ()) else None


@pytest.mark.server
def test_every_route_needs_the_key_except_the_public_ones(guarded) -> None:
    """Route by route from the live server: without a key, with a wrong key, with the key."""
    routes = served_routes(guarded)
    unclassified = sorted(r for r in routes if kind_of(*r) is None)
    assert not unclassified, (
        f"classify it: {unclassified} is served but in no list. If it serves or inspects the model or "
        "changes the server, add it to NEEDS_KEY here (or to access.ADMIN_ROUTES); if it is safe without "
        "a key, to access.PUBLIC_ROUTES with the reason")
    stale = sorted((m, p) for p, methods in NEEDS_KEY.items() for m in methods if (m, p) not in routes)
    assert not stale, f"NEEDS_KEY lists routes this vLLM does not serve: {stale}"
    table: dict[str, list[str]] = {"public": [], "key": [], "admin": []}
    for method, path in sorted(routes, key=lambda r: (r[1], r[0])):
        kind, target = kind_of(method, path), re.sub(r"\{[^}]*\}", "x", path)
        table[kind].append(f"{method} {path}")
        no_key, wrong, (with_key, body) = (raw_request(guarded, method, target)[0],
                                           raw_request(guarded, method, target, "sk-wrong")[0],
                                           raw_request(guarded, method, target, SECRET))
        where = f"{method} {path} ({kind}): {no_key} / {wrong} / {with_key}"
        if kind == "public":
            assert no_key == wrong == with_key == 200, where
            continue
        assert (no_key, wrong) == (401, 401), where
        refused_as_admin = with_key == 403 and access.SETTING_ENV.encode() in body
        assert with_key != 401 and refused_as_admin == (kind == "admin"), f"{where}: {body[:200]!r}"
    print("\n" + "\n".join(f"{kind} ({len(rows)}): {', '.join(rows)}" for kind, rows in table.items()))
    assert {"POST /invocations", "POST /tokenize", "GET /openapi.json"} <= set(table["key"])
    assert {"POST /scale_elastic_ep", "GET /load", "GET /kv_event_sources"} <= set(table["admin"])


@pytest.mark.server
def test_invocations_runs_a_chat_only_with_the_key(guarded) -> None:
    """The reported hole, end to end: SageMaker's /invocations with a real chat body."""
    chat = json.dumps({"model": guarded.model, "max_tokens": 2,
                       "messages": [{"role": "user", "content": "Hi"}]}).encode()
    for key in (None, "sk-wrong"):
        status, body = raw_request(guarded, "POST", "/invocations", key, chat)
        assert status == 401 and b"choices" not in body, (status, body[:200])
    status, body = raw_request(guarded, "POST", "/invocations", SECRET, chat)
    assert status == 200 and json.loads(body)["choices"], body[:300]
    metrics = raw_request(guarded, "GET", "/metrics")
    assert metrics[0] == 200 and b"vllm:" in metrics[1]  # Prometheus scrapes without a key


# Spellings that a path-prefix check, a lenient router or a proxy may treat as a guarded route.
PATH_TRICKS = [
    ("POST", "//v1/chat/completions"), ("POST", "/%761/chat/completions"), ("POST", "/V1/chat/completions"),
    ("POST", "/v1/chat/completions/"), ("POST", "/%69nvocations"), ("POST", "//invocations"),
    ("POST", "/invocations/"), ("POST", "/INVOCATIONS"), ("POST", "/./invocations"),
    ("POST", "/health/../invocations"), ("POST", "/v1/../invocations"), ("POST", "/health%2F..%2Finvocations"),
    ("POST", "/metrics/../invocations"), ("POST", "/invocations;x"), ("POST", "/invocations?x=/v1"),
    ("POST", "/invocations#/v1"), ("GET", "/metrics/"), ("GET", "/metrics/x"), ("GET", "//health"),
    ("GET", "/health/"), ("GET", "/HEALTH"), ("GET", "//openapi.json"), ("GET", "/openapi.json/"),
    ("GET", "/docs/"), ("GET", "/"), ("GET", "/static/x"), ("POST", "/tokenize/"),
    ("POST", "/scale_elastic_ep/"), ("POST", "/%73cale_elastic_ep"),
]


@pytest.mark.server
def test_path_tricks_methods_and_preflights_need_the_key(guarded) -> None:
    chat = json.dumps({"model": guarded.model, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
    outcomes = {}
    for method, target in PATH_TRICKS + [("POST", f"http://127.0.0.1:{guarded.port}/invocations")]:
        status, body = raw_request(guarded, method, target, body=chat.encode() if method == "POST" else None)
        outcomes[f"{method} {target}"] = status
        assert status == 401 and b"choices" not in body, (method, target, status, body[:200])
    # HEAD and OPTIONS (not a CORS preflight) of every protected route: 401 as well.
    for path in NEEDS_KEY:
        target = path.replace("{response_id}", "x")
        for method in ("HEAD", "OPTIONS", "PUT", "DELETE"):
            assert raw_request(guarded, method, target)[0] == 401, (method, path)
    # A CORS preflight is answered by vLLM's CORS middleware itself (vLLM 0.32 allows no origin by
    # default: 400 "Disallowed CORS origin"; an allowed one gets 200 "OK"): no handler runs.
    preflight = {"Origin": "https://example.com", "Access-Control-Request-Method": "POST"}
    status, body = raw_request(guarded, "OPTIONS", "/invocations", headers=preflight)
    assert (status, body) == (400, b"Disallowed CORS origin"), (status, body[:200])
    print(f"\n{len(outcomes)} path tricks, all 401: {', '.join(outcomes)}")


def descendants(pid: int) -> list[int]:
    """The process and everything it started (vLLM's EngineCore, resource tracker...)."""
    children: dict[int, list[int]] = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


@pytest.mark.server
def test_the_key_is_in_no_command_line_and_no_log(guarded) -> None:
    request(guarded.base_url, "/v1/models", key="sk-wrong")  # a rejected request is logged too
    processes = descendants(guarded.process.pid)
    assert len(processes) >= 2, "expected vLLM's API server and its EngineCore"
    for pid in processes:
        assert SECRET.encode() not in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes(), pid
    # It did reach vLLM, through the environment of the exec'd server only.
    environ = pathlib.Path(f"/proc/{guarded.process.pid}/environ").read_bytes().split(b"\0")
    assert f"VLLM_API_KEY={SECRET}".encode() in environ
    log = guarded.log_path.read_text(errors="replace")
    assert "api_key_file" in log and SECRET not in log


@pytest.mark.slow
def test_dry_run_and_errors_never_show_the_key(tiny_config, tmp_path) -> None:
    (tmp_path / "api-key").write_text(SECRET)
    env = launcher_env(MODEL_PATH=str(tiny_config), API_KEY_FILE=str(tmp_path / "api-key"))
    dry, _ = run_entrypoint("--dry-run", env=env, timeout=240)
    assert dry.returncode == 0, dry.stderr
    assert "VLLM_API_KEY=<redacted>" in dry.stdout and SECRET not in dry.stdout + dry.stderr
    # A key given on the command line, twice, is refused without echoing it.
    bad, _ = run_entrypoint("--api-key", SECRET, "--api-key", SECRET + "2", env=launcher_env(
        MODEL_PATH=str(tiny_config)), timeout=60)
    assert bad.returncode == 2 and "configuration error in `api_key`" in bad.stderr
    assert SECRET not in bad.stdout + bad.stderr


# --------------------------------------------------------------------------------------------
# Media fetching
# --------------------------------------------------------------------------------------------


@pytest.mark.server
def test_by_default_image_urls_are_refused_without_fetching(guarded, image_host) -> None:
    for url in (f"http://127.0.0.1:{image_host.port}/x.png", f"http://localhost:{image_host.port}/x.png"):
        status, body = image_chat(guarded, url, SECRET)
        # The answer names the setting that turns fetching on, and what the client can do instead.
        assert status == 400 and "fetching image URLs is off" in body, (status, body)
        assert "ALLOWED_MEDIA_DOMAINS=public" in body and "data: URL" in body, body
    assert image_host.requests == [], "the server fetched an image URL although fetching is off"
    inline = "data:image/png;base64," + base64.b64encode(png_bytes(64, 48, (0, 160, 0))).decode()
    assert image_chat(guarded, inline, SECRET)[0] == 200  # images sent inline still work


@pytest.mark.server
def test_file_urls_only_inside_the_allowed_directory(guarded, files) -> None:
    inside, outside = files / "media" / "red.png", files / "outside" / "blue.png"
    assert image_chat(guarded, inside.as_uri(), SECRET)[0] == 200
    for url in (outside.as_uri(), f"file://{files}/media/../outside/blue.png", "file:///etc/passwd"):
        status, body = image_chat(guarded, url, SECRET)
        assert status == 400 and "allowed-local-media-path" in body, (url, status, body)


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), in MiB."""
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmHWM:\s+(\d+) kB", status, re.M).group(1)) / 1024


@pytest.mark.server
def test_local_files_are_bounded_like_downloads(guarded, files) -> None:
    """Inside the allowed directory: a 3 GiB (sparse) file as an image and as a video, a FIFO, a
    directory and a double-encoded path are each a 400 at once; the API server reads none of the
    large file (its peak memory does not move) and stays up. vLLM alone read the 3 GiB file into the
    API server (+5.2 GiB) and died in PyAV, blocked a loader thread on the FIFO for good, and
    answered the double-encoded path with 500 (FileNotFoundError): the plugin's file-url-400."""
    media = files / "media"
    large = media / "recording.mp4"
    with large.open("wb") as file:
        file.truncate(3 * 1024**3)
    fifo = media / "pipe.png"
    if not fifo.exists():
        os.mkfifo(fifo)
    (media / "folder").mkdir(exist_ok=True)
    peak = peak_rss_mib(guarded.process.pid)
    limit = "larger than this server's limit of 20971520 bytes"  # media_urls.DEFAULT_MAX_BYTES
    cases = {"large image": ("image_url", large.as_uri(), limit), "large video": ("video_url", large.as_uri(), limit),
             "fifo": ("image_url", fifo.as_uri(), "not a regular file"),
             "directory": ("image_url", (media / "folder").as_uri(), "not a regular file"),
             "double-encoded": ("image_url", media.as_uri() + "/%252e%252e/red.png", "No such file")}
    for name, (kind, url, says) in cases.items():
        started = time.monotonic()
        status, body = image_chat(guarded, url, SECRET, kind)
        seconds = time.monotonic() - started
        print(f"\n{name}: {status} in {seconds:.2f} s")
        assert status == 400 and says in body, (name, status, body)
        assert seconds < 10, (name, seconds)  # at once, not after reading or waiting (measured < 0.1 s)
    rise = peak_rss_mib(guarded.process.pid) - peak
    print(f"API server peak RSS rise: {rise:.0f} MiB")
    assert rise < 100, rise
    large.unlink()
    fifo.unlink()
    assert request(guarded.base_url, "/health")[0] == 200
    assert image_chat(guarded, (media / "red.png").as_uri(), SECRET)[0] == 200


@pytest.mark.server
def test_media_past_the_pixel_budget_are_refused_before_decoding(guarded, files) -> None:
    """A 150-frame 2048x2048 `video/jpeg` data URL (629 megapixels) is the request guard's 400 at
    once, and the API server's peak memory does not move (vLLM alone decoded the 32 frames it keeps:
    +2.1 GiB, then a 400 for the context length). An image by file:// whose header claims 144
    megapixels is vLLM's own 400 at the same budget (the launcher sets VLLM_MAX_IMAGE_PIXELS from
    max_media_megapixels; vLLM's default is 178,956,970)."""
    claiming = files / "media" / "claims-144-megapixels.png"
    claiming.write_bytes(base64.b64decode(png_claiming(12_000, 12_000).split(",", 1)[1]))
    peak = peak_rss_mib(guarded.process.pid)
    started = time.monotonic()
    status, body = image_chat(guarded, video_frames_url(2048, 150), SECRET, "video_url")
    print(f"\n150 frames: {status} in {time.monotonic() - started:.2f} s")
    assert status == 400 and "629 megapixels" in body and "MAX_MEDIA_MEGAPIXELS" in body, (status, body)
    status, body = image_chat(guarded, claiming.as_uri(), SECRET)
    assert status == 400 and "exceed the maximum of 128000000 pixels" in body, (status, body)
    rise = peak_rss_mib(guarded.process.pid) - peak
    print(f"API server peak RSS rise: {rise:.0f} MiB")
    assert rise < 300, rise
    claiming.unlink()
    assert image_chat(guarded, video_frames_url(64, 4), SECRET, "video_url")[0] == 200


@pytest.mark.server
def test_file_urls_are_refused_with_a_400_where_no_directory_is_allowed(files, server) -> None:
    """The shared server keeps the default (no directory): file:// is refused outright, with 400
    and how to send the image instead (vLLM 0.32 alone raises RuntimeError there: 500; the
    plugin's file-url-400 patch). Nothing is read and the server stays healthy."""
    inside = files / "media" / "red.png"
    status, body = image_chat(server, inside.as_uri())
    assert status == 400 and "Cannot load local files without `--allowed-local-media-path`" in body, body
    assert "data: URL" in body, body
    assert request(server.base_url, "/health")[0] == 200
    inline = "data:image/png;base64," + base64.b64encode(inside.read_bytes()).decode()
    assert image_chat(server, inline)[0] == 200


# Loopback under every spelling a URL can give it, and the cloud metadata address. The image host
# listens on 127.0.0.1 and ::1, so a fetch that got through would show up in its request log.
REFUSED_SPELLINGS = ("localhost", "[::1]", "2130706433", "0x7f.1", "127.1", "[::ffff:127.0.0.1]",
                     "localhost.", "LOCALHOST")


@pytest.mark.server
def test_public_mode_refuses_loopback_under_every_spelling_for_real(server, image_host) -> None:
    """The shared server fetches public addresses, plus 127.0.0.1 listed explicitly: the same
    picture on the same loopback host is fetched by the listed name and refused by every other."""
    status, body = image_chat(server, f"http://127.0.0.1:{image_host.port}/red.png")
    assert status == 200, body
    assert image_host.requests == ["/red.png"]
    for host in REFUSED_SPELLINGS:
        status, body = image_chat(server, f"http://{host}:{image_host.port}/red.png")
        assert status == 400 and "not on a public address" in body, (host, status, body)
        assert "ALLOWED_MEDIA_DOMAINS=public" in body and "data: URL" in body, body
    status, body = image_chat(server, "http://169.254.169.254/latest/meta-data/")
    assert status == 400 and "not on a public address" in body, body
    assert image_host.requests == ["/red.png"], "a refused URL reached the host"
    assert request(server.base_url, "/health")[0] == 200


@pytest.mark.server
def test_a_redirect_to_a_refused_address_is_not_followed(server, image_host) -> None:
    """Every hop is checked: the explicitly listed host redirects to a name it is not (loopback),
    the hop is refused; a redirect to the listed host itself is followed."""
    assert "127.0.0.1" in {a[4][0] for a in socket.getaddrinfo("localhost", image_host.port)}
    for target in (f"http://localhost:{image_host.port}/internal.png", f"http://[::1]:{image_host.port}/internal.png"):
        hop = ImageHost(redirect_to=target)
        try:
            status, body = image_chat(server, f"http://127.0.0.1:{hop.port}/hop.png")
        finally:
            hop.close()
        assert hop.requests == ["/hop.png"]
        assert status == 400 and "not on a public address" in body, (status, body)
    assert image_host.requests == [], "the redirect to a refused address was followed"
    hop = ImageHost(redirect_to=f"http://127.0.0.1:{image_host.port}/fine.png")
    try:
        assert image_chat(server, f"http://127.0.0.1:{hop.port}/hop.png")[0] == 200
    finally:
        hop.close()
    assert image_host.requests == ["/fine.png"]


@pytest.mark.server
def test_trickling_image_hosts_get_a_400_by_the_deadline_and_starve_no_one(server, image_host) -> None:
    """16 requests whose image host trickles one byte every 0.5 s (and one that stalls after its
    headers) each get a 400 within vLLM's image deadline (5 s) + 1 s; a normal image URL sent while
    they hang is answered at once (here 200: 17 fetches are under the bound, MEDIA_URL_FETCHES=32)."""
    with SlowHost(interval=0.5) as slow, concurrent.futures.ThreadPoolExecutor(18) as pool:
        def timed(url: str) -> tuple[float, int, str]:
            started = time.monotonic()
            status, body = image_chat(server, url)
            return time.monotonic() - started, status, body

        urls = [slow.url(SLOW_PATHS[i % 3]) for i in range(16)] + [slow.url("/stall")]
        hanging = [pool.submit(timed, url) for url in urls]
        time.sleep(1.0)  # the slow fetches are under way
        seconds, status, body = timed(f"http://127.0.0.1:{image_host.port}/red.png")
        print(f"\nthe normal image URL beside {len(urls)} slow hosts: HTTP {status} in {seconds:.2f} s")
        assert status == 200 and seconds < 3, (seconds, status, body)
        answers = [future.result() for future in hanging]
        print("the slow hosts' clients: " + ", ".join(f"{s:.2f} s" for s, _, _ in answers))
        for url, (seconds, status, body) in zip(urls, answers):
            assert status == 400 and "took longer than 5 s" in body, (url, status, body)
            assert seconds < 6, (url, seconds)
    assert request(server.base_url, "/health")[0] == 200


# --------------------------------------------------------------------------------------------
# The container
# --------------------------------------------------------------------------------------------


def pod_problems(pod: dict) -> list[str]:
    """What would give a pod more than it needs: privileges, the host's namespaces, root."""
    problems = [f"host namespace {k}" for k in ("hostPID", "hostIPC", "hostNetwork") if pod.get(k)]
    pod_security = pod.get("securityContext") or {}
    for c in pod.get("initContainers", []) + pod["containers"]:
        security = c.get("securityContext") or {}
        if security.get("privileged"):
            problems.append(f"{c['name']}: privileged")
        if security.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{c['name']}: allowPrivilegeEscalation is not false")
        capabilities = security.get("capabilities") or {}
        if capabilities.get("drop") != ["ALL"] or capabilities.get("add"):
            problems.append(f"{c['name']}: capabilities not dropped")
        run_as_non_root = security.get("runAsNonRoot", pod_security.get("runAsNonRoot"))
        user = security.get("runAsUser", pod_security.get("runAsUser"))
        if not run_as_non_root or user in (None, 0):
            problems.append(f"{c['name']}: may run as root")
    return problems


@pytest.fixture(scope="module")
def renderings(k8s_rendered) -> dict[str, list[dict]]:
    return k8s_rendered


def test_no_pod_is_privileged_or_root(renderings) -> None:
    """Every pod of every overlay, with every component, and the Job templates, init containers
    included. Ascend NPUs do not need privileges: the device plugin gives the card, the driver's
    group (supplementalGroups) opens it."""
    checked = 0
    for name, docs in renderings.items():
        for kind, pod in pod_templates(docs):
            assert pod_problems(pod) == [], f"{name} {kind}"
            checked += 1
    assert {kind for docs in renderings.values() for kind, _ in pod_templates(docs)} == \
        {"Deployment/minicpmv", *(f"CronJob/{name}" for name in JOB_TEMPLATES)}
    assert checked >= len(OVERLAYS) * 3 * (1 + len(JOB_TEMPLATES)) - len(OVERLAYS)


def test_the_pod_check_catches_a_privileged_container(renderings) -> None:
    pod = json.loads(json.dumps(pod_templates(renderings["a2"])[0][1]))
    pod["containers"][0]["securityContext"]["privileged"] = True
    pod["securityContext"]["runAsNonRoot"] = False
    # The init container inherits the pod's runAsNonRoot too: it is checked like the server.
    assert pod_problems(pod) == ["wait-for-weights: may run as root", "server: privileged",
                                 "server: may run as root"]


def test_the_model_is_mounted_read_only_everywhere_it_is_served(renderings) -> None:
    """Only the download Job (compose: the `weights` service) writes the weights; every server (and
    its init container) mounts them read-only."""
    for name, docs in renderings.items():
        for kind, pod in pod_templates(docs):
            if kind == "CronJob/minicpmv-download-weights":
                continue
            for c in pod.get("initContainers", []) + pod["containers"]:
                for mount in c.get("volumeMounts", []):
                    if mount["mountPath"].startswith("/models"):
                        assert mount.get("readOnly") is True, f"{name} {kind} {c['name']}"
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    for service, spec in compose["services"].items():
        if service == "weights":
            assert spec["volumes"] == ["${MODEL_DIR:-./models}:/models"], "the one writer"
        elif service != "lb":  # the fleet's balancer serves no model: no weights mounted at all
            assert [v for v in spec["volumes"] if v.endswith(":/models:ro")], service
        else:
            assert not [v for v in spec["volumes"] if "/models" in v]
        for forbidden in ("privileged", "cap_add", "user", "pid", "ipc", "network_mode", "security_opt"):
            assert forbidden not in spec, f"compose {service}: {forbidden}"


def duration_s(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text))


def shutdown_timeout_of(env: dict[str, str]) -> int:
    return settings.resolve([], env)["shutdown_timeout"]


def test_grace_periods_outlast_the_shutdown_timeout(renderings) -> None:
    """The orchestrator's SIGKILL must come after vLLM's drain: compose stop_grace_period, and
    Kubernetes terminationGracePeriodSeconds (which also covers the preStop sleep)."""
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    for service, spec in compose["services"].items():
        if "env_file" not in spec:  # the fleet's balancer: no vLLM to drain
            continue
        drain = shutdown_timeout_of(env_mapping(REPO / spec["env_file"][0]))
        assert duration_s(spec["stop_grace_period"]) > drain, service
    for overlay in OVERLAYS:
        docs = renderings[overlay]
        pod = one(docs, "Deployment")["spec"]["template"]["spec"]
        drain = shutdown_timeout_of(one(docs, "ConfigMap")["data"])
        pre_stop = server_container(one(docs, "Deployment"))["lifecycle"]["preStop"]["exec"]["command"]
        assert pre_stop[0] == "sleep"
        assert pod["terminationGracePeriodSeconds"] > int(pre_stop[1]) + drain, overlay


def test_the_deployed_drain_reaches_vllm(tiny_config) -> None:
    """The shutdown timeout the env files give (the default: they do not set it) becomes vLLM's
    --shutdown-timeout."""
    for name in ("ascend.env", "cpu.env"):
        env = env_mapping(REPO / "env" / name) | {"MODEL_PATH": str(tiny_config)}
        resolution = settings.resolve([], env)
        plan = settings.build_plan(resolution, env, "cpu" if name == "cpu.env" else "ascend")
        drain = plan.vllm_args[plan.vllm_args.index("--shutdown-timeout") + 1]
        assert drain == str(resolution["shutdown_timeout"]) != "0", name


def test_the_documented_nfs_patch_keeps_the_download_job_unprivileged(tmp_path) -> None:
    """docs/deploy-ascend.md "Storage": running the download Job as an NFS export's owner is a
    kustomize-valid patch of the overlay, and the Job stays non-root and unprivileged."""
    import os
    import pathlib

    from support.deploy import K8S, by_name, render_kustomization

    doc = (REPO / "docs" / "deploy-ascend.md").read_text()
    section = doc[doc.index("**Shared storage that ignores `fsGroup`**"):]
    block = section[section.index("```yaml\n") + len("```yaml\n"):]
    patches = yaml.safe_load(block[:block.index("```")])["patches"]
    rel = pathlib.Path(os.path.relpath(K8S, tmp_path))
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [str(rel / "overlays" / "a2")], "patches": patches}))
    cronjob = by_name(render_kustomization(tmp_path), "CronJob", "minicpmv-download-weights")
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 2000
    assert pod_problems(pod) == []
