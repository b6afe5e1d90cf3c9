"""Checks of the resolved settings against the checkpoint (its config.json, read as JSON:
importing transformers would take seconds) and the platform: tensor parallelism and context length,
the devices and the permission to open them, dtype, the local media directory, the compilation
config, the tool-call parser and strict level. Each raises one ConfigError that names the fix.

The checkpoint's completeness is minicpmv_ascend.common.model_files (shared with
scripts/verify_model_dir.py).
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import pathlib
import stat
from collections.abc import Mapping
from typing import Any

from minicpmv_ascend import vllm_source
from minicpmv_ascend.common.models import Model, is_moe_id, model_for_id, version_tuple
from minicpmv_ascend.common.release_shape import (
    CANVAS_FIELDS,
    CANVAS_OVERRIDE,
    PROCESSOR_KEYS,
    THINK_CLOSE,
    THINK_OPEN,
    chat_template,
    processor_classes,
    says_canvas,
    shape_findings,
)
from minicpmv_ascend.settings.layers import Resolution, normalise_flag
from minicpmv_ascend.settings.platform import (
    ASCEND_CONTROL_DEVICES,
    PLATFORM_DTYPES,
    ascend_device_nodes,
    visible_device_count,
)
from minicpmv_ascend.settings.table import SETTINGS_BY_NAME, ConfigError, Value, error, fix_where


def read_checkpoint_config(model_dir: pathlib.Path, model: Value) -> dict[str, Any]:
    path = model_dir / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise error(SETTINGS_BY_NAME["model_path"], model, f"{path} is not valid JSON ({err})",
                    "re-download the checkpoint (config.json is damaged)") from None
    if not isinstance(data, dict):
        raise error(SETTINGS_BY_NAME["model_path"], model, f"{path} is not a JSON object",
                    "re-download the checkpoint (config.json is damaged)")
    return data


def tp_problem(tp: int, config: Mapping[str, Any]) -> str | None:
    """vLLM shards every attention's heads over the tensor-parallel ranks."""
    text = config.get("text_config") or {}
    vision = config.get("vision_config") or {}
    divisible = {
        "text_config.num_attention_heads": text.get("num_attention_heads"),
        "text_config.linear_num_key_heads": text.get("linear_num_key_heads"),
        "text_config.linear_num_value_heads": text.get("linear_num_value_heads"),
        "vision_config.num_attention_heads": vision.get("num_attention_heads"),
    }
    for key, heads in divisible.items():
        if isinstance(heads, int) and heads % tp:
            return f"it does not divide {key} ({heads})"
    kv = text.get("num_key_value_heads")
    # KV heads may also be fewer than the ranks: vLLM then replicates them.
    if isinstance(kv, int) and kv % tp and tp % kv:
        return f"it neither divides nor is a multiple of text_config.num_key_value_heads ({kv})"
    return None


def tp_choices(config: Mapping[str, Any], limit: int = 64) -> list[int]:
    return [n for n in range(1, limit + 1) if tp_problem(n, config) is None]


def check_checkpoint(resolution: Resolution, model_dir: pathlib.Path, config: Mapping[str, Any]) -> None:
    values = resolution.values
    tp_setting, tp = SETTINGS_BY_NAME["tensor_parallel_size"], values["tensor_parallel_size"]
    problem = tp_problem(tp.value, config)
    if problem:
        raise error(tp_setting, tp, f"{problem} in {model_dir / 'config.json'}",
                    f"set {fix_where(tp_setting, tp)} to one of {tp_choices(config)}")
    text = config.get("text_config") or {}
    limit, mml = text.get("max_position_embeddings"), values["max_model_len"]
    if isinstance(limit, int) and mml.value > limit:
        setting = SETTINGS_BY_NAME["max_model_len"]
        raise error(setting, mml,
                    f"exceeds the checkpoint's text_config.max_position_embeddings ({limit})",
                    f"set {fix_where(setting, mml)} to {limit} or less")


# The Ascend targets table: the checkout's, else the copy in the image. The one reader of its place
# (tools/targets.py loads it through here too: the runtime never imports the tools).
TARGETS_TABLES = (pathlib.Path(__file__).resolve().parents[3] / "deploy" / "ascend-targets.yaml",
                  pathlib.Path("/opt/minicpmv-ascend/build/ascend-targets.yaml"))


def targets_table_path() -> pathlib.Path:
    """The first of TARGETS_TABLES that exists, else the image's (a missing file says where)."""
    return next((p for p in TARGETS_TABLES if p.is_file()), TARGETS_TABLES[-1])


def targets_with_vllm(minimum: str) -> list[str]:
    """The Ascend targets whose vLLM is at least `minimum` ("v0.32.0rc1 (pre-release)"), from the
    targets table; empty when the table is not here."""
    import yaml

    path = targets_table_path()
    if not path.is_file():
        return []
    table = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [tag + (" (pre-release)" if row.get("pre_release") else "")
            for tag, row in table["targets"].items() if version_tuple(row["vllm"]) >= version_tuple(minimum)]


def check_model_in_vllm(resolution: Resolution, served: Model) -> None:
    """The installed vLLM has the checkpoint's model code (4.7 needs vLLM >= 0.32): otherwise vLLM
    would stop after loading with an unsupported-architecture error, the image rebuilt for nothing."""
    if vllm_source.has_model(served.model_type) is not False:
        return
    setting, model = SETTINGS_BY_NAME["model_path"], resolution.values["model_path"]
    targets = targets_with_vllm(served.vllm_min)
    # Into .env, so that the image `docker compose build` tags is the one `up` runs (a --build-arg
    # would build that vLLM under the default target's tag).
    where = (f"the Ascend targets that have it: {', '.join(targets)} (echo \"VLLM_ASCEND_VERSION="
             f"{targets[0].split()[0]}\" >> .env, then docker compose build)" if targets else "an image on such a vLLM")
    raise error(setting, model,
                f"{model.value or 'the checkpoint'} is {served.name} ({served.architecture}), which needs vLLM >= "
                f"{served.vllm_min}; this vLLM ({vllm_source.version()}) has no "
                f"model_executor/models/{served.model_type}.py",
                f"serve it on {where}, or point {fix_where(setting, model)} at a model this vLLM has")


def check_text_tower(resolution: Resolution, served: Model, config: Mapping[str, Any]) -> None:
    """vLLM builds the declared text tower (dense Qwen3.5) for every MiniCPM-V 4.6 / 4.7 checkpoint
    whatever its text config says: another one (4.7's MoE, `qwen3_5_moe_text`) would fail to load
    its weights or, worse, load into the wrong layers."""
    text_type = (config.get("text_config") or {}).get("model_type")
    if text_type is None or text_type == served.text_model_type:
        return
    what = "a mixture-of-experts text model" if "moe" in str(text_type) else "another text model"
    raise _not_the_dense_tower(resolution, served,
                               f"its config.json has text_config.model_type {text_type!r}, {what}")


def _not_the_dense_tower(resolution: Resolution, served: Model, what: str) -> ConfigError:
    """The refusal of a checkpoint whose text tower is not the one vLLM builds for `served`."""
    setting, model = SETTINGS_BY_NAME["model_path"], resolution.values["model_path"]
    return error(setting, model,
                 f"{what}: vLLM {vllm_source.version()} serves {served.name} only with the dense "
                 f"{served.text_model_type!r} text tower (its MiniCPM-V class always builds Qwen3_5ForCausalLM)",
                 f"serve a dense {served.name} checkpoint (e.g. {served.modelscope_id}) by pointing "
                 f"{fix_where(setting, model)} at it; a MoE {served.name} needs a vLLM whose MiniCPM-V model "
                 "code builds a MoE text tower")


def check_hub_id(resolution: Resolution, model_id: str, notes: list[str]) -> None:
    """A hub id is downloaded by vLLM after the launcher has handed over: no config.json to read
    before. What its name says is checked instead: a MoE is refused (check_text_tower's reason), a
    declared model's version needs its vLLM (check_model_in_vllm), and a name of a declared family
    that is not its declared download is served as that model with a note."""
    declared, exact = model_for_id(model_id)
    if declared is None:
        return
    if is_moe_id(model_id):
        raise _not_the_dense_tower(resolution, declared, f"{model_id} names a mixture-of-experts {declared.name}")
    check_model_in_vllm(resolution, declared)
    if not exact:
        notes.append(f"{model_id} is not the declared download of {declared.name} "
                     f"({declared.modelscope_id}): served as {declared.name} from its name; its "
                     "config.json is checked only by vLLM, after the download (download it first "
                     "and point MODEL_PATH at the directory for the launcher's checks)")


def canvas_overrides(resolution: Resolution, served: Model, config: Mapping[str, Any] | None,
                     notes: list[str]) -> dict[str, Any]:
    """The hf_overrides vLLM gets: the operator's, plus `mrope_mode: canvas` for a canvas model
    whose config.json (None: a hub id, not seen before the download) names neither field, so that
    vLLM positions images as transformers does. A config.json that names a field and says
    sequential is refused: the release then says something the reference code does not do, and
    the operator decides (HF_OVERRIDES naming the field is that decision, and is kept)."""
    operator = dict(resolution["hf_overrides"])
    if not served.canvas_mrope or any(field in operator for field in CANVAS_FIELDS):
        return operator
    seen = config if config is not None else {}
    if says_canvas(seen):
        return operator
    named = {field: seen[field] for field in CANVAS_FIELDS if field in seen}
    if named:
        setting, value = SETTINGS_BY_NAME["hf_overrides"], resolution.values["hf_overrides"]
        shown = ", ".join(f"{k}: {json.dumps(v)}" for k, v in named.items())
        raise error(setting, value,
                    f"the checkpoint's config.json says {shown}: vLLM would place {served.name}'s image "
                    "tokens at sequential positions, while transformers' reference code always places "
                    "them on the slice canvas (3D M-RoPE)",
                    f"set {fix_where(setting, value)} to {json.dumps({**operator, **CANVAS_OVERRIDE})} to "
                    "serve canvas positions as transformers does, or to "
                    f"{json.dumps({**operator, **named})} to keep the checkpoint's choice")
    where = "its config.json names" if config is not None else "its config.json is not seen before the download; assumed to name"
    notes.append(f"hf_overrides adds {json.dumps(CANVAS_OVERRIDE)}: {served.name} is trained with canvas "
                 f"M-RoPE and {where} neither {' nor '.join(CANVAS_FIELDS)}, without which vLLM places "
                 "image tokens at sequential positions, silently (transformers always uses the canvas)")
    return {**operator, **CANVAS_OVERRIDE}


def transformers_has_class(name: str) -> bool | None:
    """Whether the installed transformers has a processor class by this name, read from its files
    (importing it takes seconds): a class in one of its models' processing modules, where its
    auto classes find a processor config's class names. None when transformers is absent here."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    models = pathlib.Path(next(iter(spec.submodule_search_locations))) / "models"
    return any(f"class {name}(" in f.read_text(encoding="utf-8")
               for pattern in ("*/processing_*.py", "*/image_processing_*.py", "*/video_processing_*.py")
               for f in models.glob(pattern))


# A conversation that shows the template's switch and tool-call format: a tool call in the history
# (how the model learnt to write one) and a new question.
_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                         "required": ["city"]}}}
_CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "sunny"},
    {"role": "user", "content": "And now?"},
]


def render_template(template: str, enable_thinking: bool) -> str:
    """The template rendered as vLLM renders it (transformers' renderer), with the generation prompt."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template([_CONVERSATION], tools=[_TOOL], chat_template=template,
                                        add_generation_prompt=True, enable_thinking=enable_thinking)
    return rendered[0]


def template_findings(template: str, source: str) -> tuple[list[str], list[str]]:
    """(errors, warnings) of rendering the chat template: it must render (else every chat request
    fails); thinking on leaves a <think> block open at the prompt's end and off closes one, as the
    reasoning parser expects; the history's tool call comes out in qwen3_coder's format."""
    import jinja2

    try:
        on, off = render_template(template, True), render_template(template, False)
    # what a template raises (its raise_exception, an undefined name, a syntax error) or a Python
    # error inside it: vLLM would answer every chat request so
    except (jinja2.TemplateError, ValueError, TypeError, KeyError, AttributeError, IndexError) as err:
        return [f"the chat template in {source} does not render a conversation with a tool call "
                f"({type(err).__name__}: {err})"], []
    warnings = []
    tail_on, tail_off = on.rpartition("assistant")[2], off.rpartition("assistant")[2]
    if not (tail_on.rstrip().endswith(THINK_OPEN) and THINK_CLOSE not in tail_on):
        warnings.append(f"with enable_thinking true the chat template in {source} ends the prompt with "
                        f"{tail_on[-40:]!r}, not an open {THINK_OPEN} block: the reasoning parser would take "
                        "the answer's start for reasoning or miss it")
    if THINK_CLOSE not in tail_off:
        warnings.append(f"with enable_thinking false the chat template in {source} ends the prompt with "
                        f"{tail_off[-40:]!r}, no closed {THINK_CLOSE} block: thinking is not switched off")
    call = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>"
    if call not in on:
        start = on.find("get_weather", on.find("</tools>") + 1)
        warnings.append(f"the chat template in {source} writes the history's tool call as "
                        f"{on[max(start - 40, 0):start + 60]!r}, not qwen3_coder's {call!r}: calls would come "
                        "back as text unless TOOL_CALL_PARSER matches the template's format")
    return [], warnings


def check_release_shape(resolution: Resolution, model_dir: pathlib.Path, config: Mapping[str, Any],
                        served: Model, notes: list[str]) -> None:
    """What a released 4.7 carries (common.release_shape, shared with verify_model_dir), plus what
    only the server's environment can judge: the processor classes against the installed
    transformers, and the chat template rendered. Errors are one ConfigError; warnings go into the
    plan's notes."""
    if not served.canvas_mrope:
        return
    errors, warnings = shape_findings(model_dir, config, served)
    named = processor_classes(model_dir)
    for key in PROCESSOR_KEYS:
        name = named.get(key)
        if name and transformers_has_class(name) is False:
            errors.append(f"the processor config names {key} {name}, which this transformers has not: "
                          "vLLM would fail to load the processor")
    template, source = chat_template(model_dir)
    if template is not None:
        template_errors, template_warnings = template_findings(template, source)
        errors += template_errors
        warnings += template_warnings
    if errors:
        setting, model = SETTINGS_BY_NAME["model_path"], resolution.values["model_path"]
        raise error(setting, model, f"{model_dir} is not servable as {served.name}: {'; '.join(errors)}",
                    "fix the checkpoint's files (or download the release again), or serve it with a "
                    "transformers and vLLM that know it; scripts/verify_model_dir.py lists the same")
    notes.extend(f"{served.name} release shape: {w}" for w in warnings)


_DEVICES_SEEN = {
    "cpu": "the CPU platform runs on one device",
    "ascend": "NPUs counted from ASCEND_RT_VISIBLE_DEVICES, else /dev/davinciN",
    "cuda": "GPUs counted from CUDA_VISIBLE_DEVICES, else /dev/nvidiaN",
}


def check_devices(resolution: Resolution, platform: str, environ: Mapping[str, str],
                  dev_dir: str | os.PathLike[str] = "/dev") -> None:
    setting, tp = SETTINGS_BY_NAME["tensor_parallel_size"], resolution.values["tensor_parallel_size"]
    devices = visible_device_count(platform, environ, dev_dir)
    if devices is None or tp.value <= devices:
        return
    why = f"only {devices} device(s) visible on {platform} ({_DEVICES_SEEN[platform]})"
    if devices == 0:  # e.g. a container started without --device /dev/davinciN
        raise error(setting, tp, why, "give the container NPUs (--device /dev/davinciN, or the "
                    "Kubernetes device-plugin resource) and check ASCEND_RT_VISIBLE_DEVICES")
    raise error(setting, tp, why, f"set {fix_where(setting, tp)} to {devices} or less, or make "
                "more devices visible to the container")


def check_device_access(environ: Mapping[str, str], notes: list[str], dev_dir: str | os.PathLike[str] = "/dev") -> None:
    """On Ascend: this user may read and write every device node it will open.

    The nodes keep the host's numeric owner and group inside a container; a non-root user outside
    the driver's group (HwHiAiUser) gets `Permission denied` deep in CANN's device init, which an
    orchestrator restarts forever. Checked here instead, with the GID that fixes it.
    """
    nodes = ascend_device_nodes(environ, dev_dir)
    if nodes:
        missing = [name for name in ASCEND_CONTROL_DEVICES if not (pathlib.Path(dev_dir) / name).exists()]
        if missing:
            notes.append(f"{', '.join('/dev/' + m for m in missing)} missing: NPU initialisation will "
                         "likely fail (docker run --device /dev/<name>, or Ascend Docker Runtime)")
    denied = [p for p in nodes if not os.access(p, os.R_OK | os.W_OK)]
    if not denied:
        return
    stats = {p: p.stat() for p in denied}
    shown = ", ".join(f"/dev/{p.name} (mode {stat.filemode(s.st_mode)}, owner {s.st_uid}:{s.st_gid})"
                      for p, s in stats.items())
    user = f"uid {os.getuid()}, groups {','.join(str(g) for g in sorted({os.getgid(), *os.getgroups()}))}"
    group_ids = sorted({s.st_gid for s in stats.values() if s.st_mode & 0o060 == 0o060})
    if group_ids:
        gid = ",".join(map(str, group_ids))
        fix = (f"run the container with group {gid}, the group that owns the devices (the host's HwHiAiUser: "
               "`stat -c %g /dev/davinci_manager` on the host prints it): compose "
               f"HWHIAIUSER_GID={group_ids[0]} (group_add), Kubernetes securityContext.supplementalGroups: "
               f"[{gid}]; or build the image with --build-arg HWHIAIUSER_GID={group_ids[0]}")
    else:
        fix = ("the driver's devices are not group read-writable (installed for root only): reinstall the "
               "driver for the HwHiAiUser group, or run the container as root as a last resort "
               "(compose `user: \"0:0\"`, Kubernetes runAsUser: 0 with runAsNonRoot: false)")
    raise ConfigError("NPU device access", shown, f"the container's {dev_dir} as {user}",
                      "this user cannot read and write the NPU device nodes it will open, so the NPU "
                      "would fail to initialise (Permission denied)", fix)


def check_local_media(resolution: Resolution) -> None:
    setting, path = SETTINGS_BY_NAME["allowed_local_media_path"], resolution.values["allowed_local_media_path"]
    if not path.value:
        return
    directory = pathlib.Path(path.value)
    if not directory.is_absolute():
        why = "a relative path (it would depend on the server's working directory)"
    elif not directory.is_dir():
        why = "no such directory" if not directory.exists() else "it is a file, not a directory"
    elif directory.resolve() == pathlib.Path(directory.anchor):
        why = "the whole file system: any request could read any file the server can read"
    else:
        return
    raise error(setting, path, why, f"set {fix_where(setting, path)} to the absolute path of a "
                "directory that holds only media clients may read, or leave it empty (file:// off)")


def check_platform(resolution: Resolution, platform: str) -> None:
    allowed = PLATFORM_DTYPES.get(platform)
    dtype = resolution.values["dtype"]
    if allowed and dtype.value not in allowed:
        setting = SETTINGS_BY_NAME["dtype"]
        raise error(setting, dtype,
                    f"{dtype.value} is not supported on {platform}: the Gated DeltaNet (linear "
                    "attention) kernels of the Qwen3.5 text model need bfloat16 (with "
                    f"{dtype.value} the server starts and the first request kills the engine)",
                    f"set {fix_where(setting, dtype)} to bfloat16")


def check_compilation_config(resolution: Resolution) -> None:
    config, eager = resolution.values["compilation_config"], resolution.values["enforce_eager"]
    mode = config.value.get("cudagraph_mode")
    if eager.value and mode is not None and str(mode).upper() != "NONE":
        enforce = SETTINGS_BY_NAME["enforce_eager"]
        raise error(SETTINGS_BY_NAME["compilation_config"], config,
                    f"it asks for cudagraph_mode {mode}, but enforce_eager is true (from {eager.origin}): "
                    "vLLM would run eagerly and capture no graph",
                    f"set {fix_where(enforce, eager)} to false for graphs, or remove cudagraph_mode")


def check_tool_calling(resolution: Resolution, effective: Mapping[str, Any]) -> None:
    """The tool parser and strict level against the installed vLLM, read from its source (cheap,
    so on every start; vLLM's own registry is consulted too when parser names are given, see
    _check_parser_names). Nothing is checked when vLLM's source cannot be read here."""
    parser, level = effective["tool_call_parser"], resolution.values["tool_strict_level"]
    known = vllm_source.registered_tool_parsers()
    plugin = any(normalise_flag(a.partition("=")[0]) == "--tool-parser-plugin" for a in resolution.passthrough)
    if parser is not None and known and parser not in known and not plugin:
        setting, origin = SETTINGS_BY_NAME["tool_call_parser"], resolution.values["tool_call_parser"]
        close = difflib.get_close_matches(parser, sorted(known), n=1)
        raise error(setting, origin, f"this vLLM has no tool call parser named {parser!r}",
                    f"{'did you mean ' + repr(close[0]) + '? ' if close else ''}set {fix_where(setting, origin)} "
                    f"to one of: {', '.join(sorted(known))} (MiniCPM-V 4.6 writes qwen3_coder's format)")
    if (effective["enable_auto_tool_choice"] and level.source != "default" and vllm_source.package_dir() is not None
            and not vllm_source.has_tool_strict_level()):
        setting = SETTINGS_BY_NAME["tool_strict_level"]
        raise error(setting, level, "this vLLM has no --tool-strict-level (vLLM >= 0.32 has it; 0.30 and "
                    "0.23 constrain forced calls to the tool's schema without it)",
                    f"remove {fix_where(setting, level)}")
