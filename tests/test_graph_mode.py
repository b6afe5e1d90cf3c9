"""The Ascend graph profile: decode-only graphs (ENFORCE_EAGER=false plus
COMPILATION_CONFIG={"cudagraph_mode":"FULL_DECODE_ONLY"}, bench profile `decode-graphs`).

Its flags are parsed by `vllm serve`'s own parser of each vLLM: 0.32 (.venv) and each Ascend
target's, 0.30 and 0.23 (.venv-vllm030, .venv-vllm023: built by `make test` for the plugin's tests,
their locks carry FastAPI). Whether the graphs help on a 910B is for the A/B on an NPU
(docs/deploy-ascend.md).
"""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
import yaml

from minicpmv_ascend.settings import ConfigError, build_plan, check_with_vllm, resolve
from minicpmv_ascend.tools import bench, lifecycle, targets
from support.server import REPO, clean_env

PROFILE = bench.PROFILES["decode-graphs"]["env"]
MODEL_ID = {"MODEL_PATH": "OpenBMB/MiniCPM-V-4.6-Thinking", "VLLM_USE_MODELSCOPE": "1"}


def plan(cli=(), **env):
    environ = {**MODEL_ID, **env}
    return build_plan(resolve(list(cli), environ), environ, "cpu")


@pytest.mark.slow  # imports vLLM's serve parser in this process (~5 s of CPU)
def test_profile_emits_decode_graph_flags_and_vllm_032_parses_them() -> None:
    p = plan(**PROFILE)
    args = p.vllm_args
    assert "--no-enforce-eager" in args and "--enforce-eager" not in args
    assert json.loads(args[args.index("--compilation-config") + 1]) == {"cudagraph_mode": "FULL_DECODE_ONLY"}
    check_with_vllm(p)  # vLLM 0.32's serve parser, and the launcher's own spelling checks


def test_default_passes_no_compilation_config() -> None:
    args = plan().vllm_args
    assert "--compilation-config" not in args and "--enforce-eager" in args


@pytest.mark.parametrize("env, origin", [
    ({"COMPILATION_CONFIG": '{"cudagraph_mode":"FULL_DECODE_ONLY"}'}, "default"),
    ({"COMPILATION_CONFIG": '{"cudagraph_mode":"FULL_DECODE_ONLY"}', "ENFORCE_EAGER": "true"}, "env ENFORCE_EAGER"),
])
def test_graph_mode_with_enforce_eager_is_refused(env, origin) -> None:
    """vLLM would silently run eagerly: the launcher says so and how to fix it (exit 2)."""
    with pytest.raises(ConfigError) as info:
        plan(**env)
    err = info.value
    assert err.key == "compilation_config" and "FULL_DECODE_ONLY" in err.why
    assert f"enforce_eager is true (from {origin})" in err.why and "ENFORCE_EAGER" in err.fix and "false" in err.fix
    assert plan(COMPILATION_CONFIG='{"cudagraph_mode":"NONE"}').vllm_args  # NONE with eager is consistent


@pytest.mark.parametrize("config, words", [
    ('{"cudagraph_mod":"FULL_DECODE_ONLY"}', "cudagraph_mod Unexpected keyword argument"),
    ('{"cudagraph_mode":"FULL_DECODE"}', "unknown name 'FULL_DECODE' (cudagraph_mode is one of NONE, PIECEWISE, FULL,"),
])
@pytest.mark.slow  # imports vLLM's serve parser in this process (~5 s of CPU)
def test_vllm_judges_the_config_and_the_setting_is_named(config, words) -> None:
    """A misspelt key or mode is reported for the setting, with vLLM's reason (argparse alone
    would raise a bare KeyError for the mode), and the launcher asks vLLM at start whenever the
    setting is not the default (it is vLLM's to judge)."""
    from minicpmv_ascend import launcher

    p = plan(ENFORCE_EAGER="false", COMPILATION_CONFIG=config)
    with pytest.raises(ConfigError) as info:
        check_with_vllm(p)
    err = info.value
    assert err.key == "compilation_config" and words in err.why, err.why
    assert "env COMPILATION_CONFIG" in err.fix and "FULL_DECODE_ONLY" in err.fix
    assert launcher.only_vllm_can_judge(p.resolution)
    assert not launcher.only_vllm_can_judge(plan().resolution)


@pytest.mark.slow  # imports vLLM's serve parser in this process (~5 s of CPU)
def test_cc_and_compilation_config_are_one_setting_dotted_spellings_refused() -> None:
    """-cc and --compilation-config are the setting (so it is listed and checked once); a dotted
    spelling would change it behind the launcher's back and is refused."""
    p = plan(["--no-enforce-eager", "-cc", '{"cudagraph_mode":"FULL_DECODE_ONLY"}'])
    assert p.resolution.values["compilation_config"].origin == "cli flag -cc"
    check_with_vllm(p)
    with pytest.raises(ConfigError, match="abbreviated or dotted"):
        plan(["--compilation-config.cudagraph_mode", "FULL"])
    with pytest.raises(ConfigError, match="given twice"):
        plan(["-cc", "{}", "--compilation-config", "{}"])


def test_bench_ab_has_the_profile() -> None:
    assert bench.PROFILES["decode-graphs"]["kind"] == "entrypoint"
    assert PROFILE == {"ENFORCE_EAGER": "false", "COMPILATION_CONFIG": '{"cudagraph_mode":"FULL_DECODE_ONLY"}'}
    out = bench.make_profile("decode-graphs", {}, "B", REPO / "no-such-dir")
    assert out.env["VLLM_CACHE_ROOT"].endswith("compile-cache-B"), "compiled starts keep their cache per profile"


def test_bench_starts_the_launcher_where_no_checkout_is(tmp_path, monkeypatch) -> None:
    """In the image the package lives in site-packages without entrypoint.py next to it: `ab`
    (run there for the A/B on an NPU) starts the installed launcher module instead."""
    profile = bench.make_profile("decode-graphs", {}, "B", tmp_path)
    cmd, env = bench.server_command(profile, tmp_path, 8123, "m", ["--max-log-len", "10"])
    assert cmd[1] == str(REPO / "entrypoint.py") and env["COMPILATION_CONFIG"] == PROFILE["COMPILATION_CONFIG"]
    monkeypatch.setattr(lifecycle, "REPO", tmp_path)
    cmd, _ = bench.server_command(profile, tmp_path, 8123, "m", ["--max-log-len", "10"])
    assert cmd[1:] == ["-m", "minicpmv_ascend.launcher", "--max-log-len", "10"]
    shown = subprocess.run([cmd[0], "-m", "minicpmv_ascend.launcher", "--help"], capture_output=True, text=True,
                           timeout=60, cwd=tmp_path, env=clean_env())
    assert shown.returncode == 0 and "compilation_config / COMPILATION_CONFIG" in shown.stdout
    assert lifecycle.VLLM_PROCESS.search(" ".join(cmd))


PARSE = textwrap.dedent("""\
    import json, sys
    from minicpmv_ascend import settings
    from minicpmv_ascend.settings import vllm_check
    environ = json.loads(sys.argv[1])
    plan = settings.build_plan(settings.resolve([], environ), environ, "cpu")
    import vllm
    import vllm.platforms
    from vllm.platforms.cpu import CpuPlatform
    # These CUDA wheels detect no platform on this machine; the parser's defaults need one (0.30
    # builds a DeviceConfig for them). The flags are parsed the same on every platform.
    vllm.platforms._current_platform = CpuPlatform()
    parser = vllm_check.vllm_parser()  # vllm serve's parser (each target's lock carries FastAPI)
    namespace, rest = parser.parse_known_args(plan.vllm_args)
    assert "--compilation-config" not in rest and "--no-enforce-eager" not in rest, rest
    mode = namespace.compilation_config.cudagraph_mode
    print(json.dumps({"vllm": vllm.__version__, "enforce_eager": namespace.enforce_eager,
                      "cudagraph_mode": getattr(mode, "name", str(mode))}))
""")


def target_envs() -> list:
    """(vLLM version, interpreter) of each target's environment (vLLM 0.32, .venv's, is checked
    in-process above: v0.32.0rc1's vLLM is the CPU stack's)."""
    out = []
    table = yaml.safe_load((REPO / "deploy" / "ascend-targets.yaml").read_text())
    for target in table["targets"].values():
        if not targets.own_venv(target):
            continue  # its vLLM is the CPU stack's: .venv, checked in-process above
        venv = REPO / targets.test_venv(target)
        out.append(pytest.param(target["vllm"], venv / "bin" / "python", id=f"vllm-{target['vllm']}",
                                marks=pytest.mark.skipif(not (venv / "bin" / "python").exists(),
                                                         reason=f"{venv.name} is not built here")))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("version, python", target_envs())
def test_each_targets_vllm_parses_the_profile(version, python) -> None:
    result = subprocess.run([str(python), "-c", PARSE, json.dumps({**MODEL_ID, **PROFILE})], capture_output=True,
                            text=True, timeout=300, cwd=REPO, env=clean_env(PYTHONPATH=str(REPO / "src")))
    assert result.returncode == 0, result.stderr[-3000:]
    parsed = json.loads(result.stdout.strip().splitlines()[-1])
    assert parsed["vllm"].startswith(version)
    assert parsed["cudagraph_mode"] == "FULL_DECODE_ONLY" and parsed["enforce_eager"] is False, parsed
