"""The health probe (healthcheck/probe.py -> minicpmv_ascend.probes) against the real vLLM server,
against ports where no server answers, and with bad options."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from minicpmv_ascend import probes
from minicpmv_ascend.common.http import Client

REPO = Path(__file__).resolve().parent.parent
PROBE = REPO / "healthcheck" / "probe.py"
MODES = ("live", "ready", "smoke")
# Variables the probe reads; cleared so the developer's shell cannot change the outcome.
PROBE_ENV = ("PORT", "SERVED_MODEL_NAME", "VLLM_API_KEY", "API_KEY_FILE", "PYTHONPATH")
# Python start-up plus slack on a loaded 2-core machine, on top of the probe's own timeout.
SLACK_S = 8.0


def run_probe(*args: str, env: dict[str, str] | None = None,
              timeout: float = 180) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run the shim by path, as the container does; no PYTHONPATH, so it must find src/ itself."""
    full_env = {k: v for k, v in os.environ.items() if k not in PROBE_ENV}
    full_env.update(env or {})
    start = time.monotonic()
    result = subprocess.run([sys.executable, str(PROBE), *args], env=full_env,
                            capture_output=True, text=True, timeout=timeout)
    return result, time.monotonic() - start


def client_env(server: Any) -> dict[str, str]:
    return dict(server.env)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts TCP connections (kernel backlog) but never answers: a hung server."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


# ------------------------------------------------------------------ healthy server


@pytest.mark.server
@pytest.mark.parametrize("mode", MODES)
def test_each_probe_mode_passes_against_the_server(server: Any, mode: str) -> None:
    result, _ = run_probe(mode, "--url", server.base_url, "--model", server.model,
                          env=client_env(server))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{mode} ok:")
    assert result.stderr == ""


@pytest.mark.server
def test_probe_defaults_from_env(server: Any) -> None:
    """In the container the probe gets no options: PORT and SERVED_MODEL_NAME say where and what."""
    for mode in MODES:
        result, _ = run_probe(mode, env=client_env(server))
        assert result.returncode == 0, (mode, result.stderr)


@pytest.mark.server
def test_probe_accepts_openai_base_url(server: Any) -> None:
    result, _ = run_probe("ready", "--url", server.base_url + "/v1/", "--model", server.model)
    assert result.returncode == 0, result.stderr


@pytest.mark.server
@pytest.mark.parametrize("mode", MODES)
def test_json_report_of_each_mode_lists_its_checks(server: Any, mode: str) -> None:
    result, _ = run_probe(mode, "--json", "--url", server.base_url, "--model", server.model,
                          env=client_env(server))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["mode"], report["ok"], report["error"]) == (mode, True, None)
    assert report["model"] == server.model and report["url"] == server.base_url
    names = [check["name"] for check in report["checks"]]
    expected = {"live": ["health"], "ready": ["health", "models"],
                "smoke": ["text", "image", "image_tokens", "thinking_off"]}[mode]
    assert names == expected
    assert all(check["ok"] and check["latency_ms"] >= 0 for check in report["checks"])
    assert report["latency_ms"] == pytest.approx(
        sum(check["latency_ms"] for check in report["checks"]), abs=0.5)


@pytest.mark.server
def test_smoke_report_counts_image_tokens_and_reasoning_per_thinking_mode(server: Any) -> None:
    result, _ = run_probe("smoke", "--json", "--url", server.base_url, "--model", server.model,
                          env=client_env(server))
    checks = {c["name"]: c["details"] for c in json.loads(result.stdout)["checks"]}
    text, image, off = checks["text"], checks["image"], checks["thinking_off"]
    assert image["prompt_tokens"] > text["prompt_tokens"]
    for details in (text, image, off):
        assert details["total_tokens"] == details["prompt_tokens"] + details["completion_tokens"]
        assert details["finish_reason"] in ("stop", "length")
    # Thinking on (template default): 16 tokens of a random model never leave the <think> block.
    assert text["reasoning_chars"] > 0 and text["content_chars"] == 0
    assert text["reasoning_tokens"] == text["completion_tokens"]
    assert off["reasoning_chars"] == 0 and off["content_chars"] > 0
    # The random model writes stray `<think>` tokens in its answer; vLLM's minicpmv parser drops
    # such a block from the content and counts it as reasoning. Thinking off still starts with content.
    assert off["reasoning_tokens"] in (0, None) or off["reasoning_tokens"] < off["completion_tokens"]


@pytest.mark.server
def test_smoke_without_reasoning_parser_checks(server: Any) -> None:
    result, _ = run_probe("smoke", "--json", "--no-expect-reasoning", "--url", server.base_url,
                          "--model", server.model, env=client_env(server))
    assert result.returncode == 0, result.stderr
    names = [c["name"] for c in json.loads(result.stdout)["checks"]]
    assert names == ["text", "image", "image_tokens"]


@pytest.mark.server
def test_smoke_answer_checks_run_with_thinking_off(server: Any) -> None:
    """`.` matches any non-empty answer, even the random model's: the answer paths run and pass."""
    result, _ = run_probe("smoke", "--json", "--expect-text-answer", ".",
                          "--expect-image-answer", ".", "--answer-max-tokens", "8",
                          "--url", server.base_url, "--model", server.model,
                          env=client_env(server))
    assert result.returncode == 0, result.stderr
    checks = {c["name"]: c["details"] for c in json.loads(result.stdout)["checks"]}
    assert list(checks) == ["text", "image", "image_tokens", "text_answer", "image_answer"]
    assert checks["text_answer"]["completion_tokens"] <= 8
    assert checks["image_answer"]["prompt_tokens"] > checks["text_answer"]["prompt_tokens"]


@pytest.mark.server
def test_api_key_from_env_and_file_is_never_printed(server: Any, tmp_path: Path) -> None:
    """A key the server does not require is ignored by vLLM: the probe still passes, and the key
    appears nowhere in the output, neither on success nor on failure."""
    secret = "sk-probe-test-9f3c1d"
    key_file = tmp_path / "api-key"
    key_file.write_text(secret + "\n")
    env = client_env(server)
    for key_env in ({"VLLM_API_KEY": secret}, {"API_KEY_FILE": str(key_file)}):
        ok, _ = run_probe("smoke", "--json", env={**env, **key_env})
        failed, _ = run_probe("ready", "--json", "--model", "no-such-model",
                              env={**env, **key_env})
        assert (ok.returncode, failed.returncode) == (0, 1), ok.stderr + failed.stderr
        for output in (ok.stdout, ok.stderr, failed.stdout, failed.stderr):
            assert secret not in output


@pytest.mark.server
def test_probe_wall_time_of_each_mode_is_within_its_default_timeout(server: Any, record_property: Any) -> None:
    """Measure each mode (median of 3): the probe's own request time and the wall time of the
    whole command (Python start-up included), which is what a container healthcheck pays."""
    lines = []
    for mode in MODES:
        runs = [run_probe(mode, "--json", env=client_env(server)) for _ in range(3)]
        assert all(r.returncode == 0 for r, _ in runs), [r.stderr for r, _ in runs]
        request_ms = sorted(json.loads(r.stdout)["latency_ms"] for r, _ in runs)[1]
        wall_ms = sorted(wall for _, wall in runs)[1] * 1000
        record_property(f"{mode}_request_ms", request_ms)
        record_property(f"{mode}_wall_ms", round(wall_ms, 1))
        lines.append(f"{mode}: requests {request_ms:.1f} ms, command {wall_ms:.0f} ms")
        assert wall_ms < probes.DEFAULT_TIMEOUT[mode] * 1000
    print("\nprobe latencies (median of 3):\n  " + "\n  ".join(lines))


# ------------------------------------------------------------------ unhealthy


@pytest.mark.parametrize("mode", MODES)
def test_nothing_listening_fails_fast(mode: str) -> None:
    port = closed_port()
    result, elapsed = run_probe(mode, "--url", f"http://127.0.0.1:{port}", "--timeout", "5")
    assert result.returncode == 1
    assert "connection refused" in result.stderr
    # vLLM refuses connections for its whole start-up: say so, rather than sound like a crash
    # (tests/test_faults.py sees it against a real server loading its model).
    assert "still starting" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert elapsed < 5 + SLACK_S


@pytest.mark.parametrize("mode", MODES)
def test_nothing_listening_is_a_json_connection_refused_failure(mode: str) -> None:
    result, _ = run_probe(mode, "--json", env={"PORT": str(closed_port())})
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False and "connection refused" in report["error"]
    assert report["checks"][-1]["ok"] is False


@pytest.mark.parametrize("mode", MODES)
def test_hung_server_times_out(mode: str, silent_port: int) -> None:
    result, elapsed = run_probe(mode, "--url", f"http://127.0.0.1:{silent_port}", "--timeout", "0.5")
    assert result.returncode == 1
    assert "timed out after 0.5 s" in result.stderr
    assert 0.5 <= elapsed < 0.5 + SLACK_S


@pytest.mark.server
@pytest.mark.parametrize("mode", ("ready", "smoke"))
def test_probe_without_a_model_name_probes_the_one_served(server_47: Any, mode: str) -> None:
    """SERVED_MODEL_NAME unset or `auto` (the launcher's default names the server after its model:
    minicpm-v-4.7 here): the probe takes the one model /v1/models lists; a wrong name would 404."""
    for env in ({}, {"SERVED_MODEL_NAME": "auto"}):
        result, _ = run_probe(mode, "--url", server_47.base_url, env=env)
        assert result.returncode == 0, (env, result.stderr)


@pytest.mark.server
def test_ready_fails_for_a_model_not_served(server: Any) -> None:
    result, _ = run_probe("ready", "--url", server.base_url, "--model", "not-this-model")
    assert result.returncode == 1
    assert "'not-this-model' is not served" in result.stderr
    assert server.model in result.stderr  # names what is served, to help fix the setting


@pytest.mark.server
def test_smoke_fails_for_a_model_not_served(server: Any) -> None:
    result, _ = run_probe("smoke", "--url", server.base_url, "--model", "not-this-model")
    assert result.returncode == 1
    assert "text: POST /v1/chat/completions: HTTP 404" in result.stderr


@pytest.mark.server
def test_smoke_fails_when_the_answer_does_not_match(server: Any) -> None:
    """The random model cannot do sums: an expected answer is a failure, named as such."""
    result, _ = run_probe("smoke", "--json", "--expect-text-answer", r"^\s*5\s*$",
                          "--url", server.base_url, "--model", server.model)
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["checks"][-1]["name"] == "text_answer"
    assert "does not match" in report["error"] and "does not match" in result.stderr


@pytest.mark.server
def test_smoke_fails_when_reasoning_is_expected_but_thinking_is_off(server: Any) -> None:
    """What a server without --reasoning-parser looks like from the probe's side, checked on a
    real response: the thinking-off answer has no `reasoning`, so the thinking-on check fails."""
    client = Client(server.base_url, 60, os.environ.get("VLLM_API_KEY"))
    case = probes.ChatCase("text", with_image=False, thinking=False, max_tokens=8)
    response = client.post_json("/v1/chat/completions",
                                probes.chat_payload(case, server.model, ""))
    result = probes.validate_completion(response, case)
    on_case = probes.ChatCase("text", with_image=False, thinking=None, max_tokens=8)
    with pytest.raises(probes.ProbeFailure, match="--reasoning-parser"):
        probes.validate_reasoning(result, on_case)


@pytest.mark.server
@pytest.mark.parametrize("field, message", [
    ("id", "missing field 'id'"),
    ("usage", "missing field 'usage'"),
    ("choices", "missing field 'choices'"),
])
def test_shape_check_names_the_missing_field(server: Any, field: str, message: str) -> None:
    response = _real_completion(server)
    del response[field]
    with pytest.raises(probes.ProbeFailure, match=message):
        probes.validate_completion(response, _CASE)


@pytest.mark.server
def test_shape_check_catches_inconsistent_usage(server: Any) -> None:
    response = _real_completion(server)
    assert probes.validate_completion(response, _CASE)["completion_tokens"] == 8
    response["usage"]["total_tokens"] += 1
    with pytest.raises(probes.ProbeFailure, match="total_tokens"):
        probes.validate_completion(response, _CASE)
    response = _real_completion(server)
    response["object"] = "text_completion"
    with pytest.raises(probes.ProbeFailure, match="'object'"):
        probes.validate_completion(response, _CASE)


_CASE = probes.ChatCase("text", with_image=False, thinking=None, max_tokens=8)


def _real_completion(server: Any) -> dict[str, Any]:
    client = Client(server.base_url, 60, os.environ.get("VLLM_API_KEY"))
    return client.post_json("/v1/chat/completions", probes.chat_payload(_CASE, server.model, ""))


# ------------------------------------------------------------------ usage errors


@pytest.mark.parametrize("args, env", [
    ((), {}),
    (("bogus",), {}),
    (("live", "--timeout", "0"), {}),
    (("live", "--timeout", "soon"), {}),
    (("live", "--url", "ftp://example.org"), {}),
    (("smoke", "--expect-text-answer", "(unclosed"), {}),
    (("smoke", "--max-tokens", "-1"), {}),
    (("live", "--expect-text-answer", "5"), {}),  # a smoke-only option
    (("live",), {"PORT": "eighty"}),
    (("live",), {"API_KEY_FILE": "/nonexistent/api-key"}),
])
def test_usage_errors_exit_2(args: tuple[str, ...], env: dict[str, str]) -> None:
    result, _ = run_probe(*args, env=env, timeout=30)
    assert result.returncode == 2, result.stderr
    assert "error" in result.stderr


def test_help_exits_0_and_lists_the_options() -> None:
    result, _ = run_probe("smoke", "--help", timeout=30)
    assert result.returncode == 0
    assert "--expect-image-answer" in result.stdout


# ------------------------------------------------------------------ pieces


def test_probe_image_is_a_valid_non_square_png() -> None:
    """Decode the PNG with zlib only (the probe must not need Pillow), and check the drawing."""
    data = probes.square_png()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == probes.PNG_SIZE and width != height
    idat_len = int.from_bytes(data[33:37], "big")
    assert data[37:41] == b"IDAT"
    raw = zlib.decompress(data[41:41 + idat_len])
    stride = 1 + 3 * width
    assert len(raw) == stride * height

    def pixel(x: int, y: int) -> tuple[int, ...]:
        offset = y * stride + 1 + 3 * x
        return tuple(raw[offset:offset + 3])

    assert pixel(0, 0) == probes.WHITE and pixel(width // 2, height // 2) == probes.RED
    colours = {pixel(x, y) for x in range(width) for y in range(height)}
    assert colours == {probes.WHITE, probes.RED}


def test_probe_image_decodes_with_pillow() -> None:
    image_module = pytest.importorskip("PIL.Image")
    import io

    image = image_module.open(io.BytesIO(probes.square_png()))
    image.load()
    assert image.size == probes.PNG_SIZE and image.mode == "RGB"
    left, top, right, bottom = probes.SQUARE_BOX
    assert image.getpixel((left, top)) == probes.RED
    assert image.getpixel((right, bottom)) == probes.WHITE
    assert image.getpixel((left - 1, top)) == probes.WHITE


def test_bad_api_key_settings_are_usage_errors(tmp_path: Path) -> None:
    """The probe reads the key with the launcher's rules (common.api_key): both variables set, or an
    empty key file, is exit 2 with the reason, never a request without the key."""
    key_file = tmp_path / "key"
    key_file.write_text("\n")
    clean = {k: v for k, v in os.environ.items() if k not in ("VLLM_API_KEY", "API_KEY_FILE")}
    for env in ({"API_KEY_FILE": str(key_file)}, {"API_KEY_FILE": str(key_file), "VLLM_API_KEY": "k"}):
        result = subprocess.run([sys.executable, str(REPO / "healthcheck" / "probe.py"), "live", "--url",
                                 "http://127.0.0.1:9"], env={**clean, **env}, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("minicpmv-probe: error: ")
        assert ("empty" if "VLLM_API_KEY" not in env else "VLLM_API_KEY or API_KEY_FILE") in result.stderr


def test_client_sends_the_key_only_when_there_is_one() -> None:
    client = Client("http://127.0.0.1:1", 1, "k")
    assert client._headers(True)["Authorization"] == "Bearer k"
    assert "Authorization" not in Client("http://127.0.0.1:1", 1)._headers(False)


def test_probe_module_uses_only_the_standard_library() -> None:
    """Started every few seconds by orchestrators: it must import nothing outside the stdlib."""
    code = ("import sys; before = set(sys.modules); import minicpmv_ascend.probes; "
            "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
            "print(sorted(m for m in new if m not in sys.stdlib_module_names "
            "and m != 'minicpmv_ascend'))")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.server
def test_console_entry_point_runs(server: Any) -> None:
    """`minicpmv-probe` is minicpmv_ascend.probes:main; run that same function as a module."""
    env = {k: v for k, v in os.environ.items() if k not in PROBE_ENV}
    env.update(client_env(server), PYTHONPATH=str(REPO / "src"))
    result = subprocess.run([sys.executable, "-m", "minicpmv_ascend.probes", "live"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_url_default_is_local_port() -> None:
    assert probes._default_url({}) == "http://127.0.0.1:8000"
    assert probes._default_url({"PORT": "9001"}) == "http://127.0.0.1:9001"
    with pytest.raises(probes.UsageError):
        probes._default_url({"PORT": "70000"})
