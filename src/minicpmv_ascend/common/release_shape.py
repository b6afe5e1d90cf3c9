"""What a released MiniCPM-V 4.7 checkpoint carries beyond complete files, read as JSON and text:
the fields vLLM reads for canvas M-RoPE, `downsample_mode`, the processor classes, and the chat
template's thinking switch and tool-call format. The judgement the launcher's start-up check
(settings, which also renders the template and asks the installed transformers) and
scripts/verify_model_dir.py (the host's check, no transformers there) share.

Standard library only, Python 3.7 or newer (see minicpmv_ascend.common).
"""

from __future__ import annotations

import json

# vLLM >= 0.32 places 4.7's image tokens on the slice canvas (3D M-RoPE) only when the config says
# so: `uses_mrope_canvas` true or an `mrope_mode` containing "canvas"
# (model_executor/models/minicpmv4_7.py, `_init_canvas_mrope`); otherwise every image gets
# sequential positions and vLLM logs nothing. transformers' 4.7 (the reference code) always
# computes canvas positions (`get_rope_index`) and its MiniCPMV4_7Config defines neither field.
CANVAS_FIELDS = ("uses_mrope_canvas", "mrope_mode")
CANVAS_OVERRIDE = {"mrope_mode": "canvas"}

# The processor's two modes (transformers' MiniCPMV4_6ImageProcessor, which 4.7 uses); config.json's
# field is the model's default, which llama.cpp's converter reads from there for 4.7.
DOWNSAMPLE_MODES = ("16x", "4x")

# The classes a checkpoint's processor config names, against what the kit's transformers maps for
# the model (transformers 5.19: `minicpmv4_7` -> 4.6's image and video processors; its own
# MiniCPMV4_7Processor). Keys: where each name is in processor_config.json.
PROCESSOR_KEYS = ("processor_class", "image_processor_type", "video_processor_type")

# qwen3_coder's tool-call format (the kit's default TOOL_CALL_PARSER), as the template must write
# a call in the history for the model to write it so.
TOOL_CALL_MARKERS = ("<tool_call>", "<function=", "<parameter=")

# What the `minicpmv` reasoning parser expects of the prompt's end: thinking on leaves a `<think>`
# block open, thinking off closes an empty one (`enable_thinking` is the template's switch).
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def says_canvas(config):
    """vLLM's own test of a config for canvas positions (`_init_canvas_mrope`)."""
    mode = config.get("mrope_mode")
    return bool(config.get("uses_mrope_canvas")) or (mode is not None and "canvas" in str(mode).lower())


def _json(path):
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def chat_template(model_dir):
    """(template text, file it came from) or (None, None): chat_template.jinja, else the
    `chat_template` of tokenizer_config.json or processor_config.json (a string, or the `default`
    of a list of named templates), as transformers looks for it."""
    path = model_dir / "chat_template.jinja"
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8"), path.name
        except OSError:
            return None, None
    for name in ("tokenizer_config.json", "processor_config.json", "chat_template.json"):
        template = (_json(model_dir / name) or {}).get("chat_template")
        if isinstance(template, list):
            template = next((t.get("template") for t in template
                             if isinstance(t, dict) and t.get("name") == "default"), None)
        if isinstance(template, str) and template:
            return template, name
    return None, None


def processor_classes(model_dir):
    """{key of PROCESSOR_KEYS: class name} as the checkpoint's processor config names them
    (processor_config.json nests the image and video processors; older layouts are flat files)."""
    found = {}
    nested = _json(model_dir / "processor_config.json") or {}
    flat = _json(model_dir / "preprocessor_config.json") or {}
    video = _json(model_dir / "video_preprocessor_config.json") or {}
    tokenizer = _json(model_dir / "tokenizer_config.json") or {}
    for source in (tokenizer, flat, nested):
        if isinstance(source.get("processor_class"), str):
            found["processor_class"] = source["processor_class"]
    for key, part, other in (("image_processor_type", "image_processor", flat),
                             ("video_processor_type", "video_processor", video)):
        value = (nested.get(part) or {}).get(key) if isinstance(nested.get(part), dict) else None
        value = value or other.get(key)
        if isinstance(value, str):
            found[key] = value
    return found


def declared_processor_classes(model):
    """The declared model's processor classes (common.models), by PROCESSOR_KEYS."""
    return dict(zip(PROCESSOR_KEYS, model.processor_classes))


def canvas_findings(config, model):
    """(errors, warnings) about the canvas fields of `model`'s config.json (the launcher's own check
    adds the override or refuses: settings.checks.canvas_overrides)."""
    if not model.canvas_mrope or says_canvas(config):
        return [], []
    named = ", ".join(f"{f}: {json.dumps(config[f])}" for f in CANVAS_FIELDS if f in config)
    if named:
        return [f"config.json says {named}: vLLM would place image tokens at sequential positions, while "
                f"transformers' {model.name} always uses the slice canvas (the launcher refuses it unless "
                "HF_OVERRIDES names the field)"], []
    return [], ["config.json names neither {}: without one vLLM places image tokens at sequential "
                "positions, silently; the launcher adds HF_OVERRIDES {}".format(
                    " nor ".join(CANVAS_FIELDS), json.dumps(CANVAS_OVERRIDE))]


def shape_findings(model_dir, config, model):
    """(errors, warnings) about a complete checkpoint of `model` (common.models) beyond the canvas
    fields and the template's text (template_text_findings). Errors: what vLLM cannot serve as this
    model (the launcher exits 2); warnings: what differs from the kit's checkpoint but is served. Only models with canvas M-RoPE (4.7) are
    checked: the 4.6 release is what the kit was built on."""
    errors, warnings = [], []
    if not model.canvas_mrope:
        return errors, warnings
    mode = config.get("downsample_mode")
    if mode is None:
        warnings.append(f"config.json has no downsample_mode: the processor's default ({DOWNSAMPLE_MODES[0]}) applies, and tools "
                        "that read it from config.json (llama.cpp's converter) lack it")
    elif mode not in DOWNSAMPLE_MODES:
        errors.append("config.json says downsample_mode {}: the processor knows only {}".format(
            json.dumps(mode), " and ".join(DOWNSAMPLE_MODES)))
    declared = declared_processor_classes(model)
    named = processor_classes(model_dir)
    for key in PROCESSOR_KEYS:
        if named.get(key) != declared[key]:
            warnings.append("the processor config names {} {} where the kit's transformers maps {} to {}{}".format(
                key, named.get(key) or "nothing", model.model_type, declared[key],
                "" if named.get(key) else " (the default applies)"))
    if chat_template(model_dir)[0] is None:
        errors.append("no chat template (chat_template.jinja, or chat_template in tokenizer_config.json): "
                      "vLLM would refuse every chat request")
    return errors, warnings


def template_text_findings(model_dir, model):
    """Warnings about the chat template read as text, where nothing can render it (the host has no
    Jinja; the launcher renders it instead: settings.checks.template_findings): its thinking switch
    and its tool-call format."""
    template, source = chat_template(model_dir)
    if template is None or not model.canvas_mrope:
        return []
    warnings = []
    if model.thinking_switch and "enable_thinking" not in template:
        warnings.append(f"the chat template in {source} never reads enable_thinking: thinking cannot be switched "
                        "per request, and the reasoning parser is told it is")
    missing = [m for m in TOOL_CALL_MARKERS if m not in template]
    if missing:
        warnings.append("the chat template in {} has no {}: its tool calls are not in qwen3_coder's format "
                        "(TOOL_CALL_PARSER), so calls would come back as text".format(source, ", ".join(missing)))
    return warnings
