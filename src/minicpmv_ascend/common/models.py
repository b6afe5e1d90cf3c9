"""The MiniCPM-V models this kit serves: one declaration per model, keyed by config.json's
`model_type`. Everything that differs between them is derived from here (the launcher's defaults
and checks, the random checkpoint presets, the host-side checkpoint check, the weights script's
names; tests/test_deploy_scripts.py keeps scripts/download_weights.sh equal to it).

Standard library, Python 3.7 (scripts/verify_model_dir.py runs on an Ascend host's own Python).
"""

from __future__ import annotations

import re
from collections import OrderedDict, namedtuple

Model = namedtuple("Model", [
    "model_type",            # config.json `model_type`
    "name",                  # what the logs and errors call it
    "architecture",          # config.json `architectures[0]`: vLLM's registry key
    "transformers_config",   # the transformers class vLLM's model code imports
    "transformers_min",      # the first transformers release that has it
    "vllm_min",              # the first vLLM release whose model code has it
    "served_model_name",     # the `model` clients send, by default
    "thinking_switch",       # True: one checkpoint, thinking on or off per request
    "canvas_mrope",          # True: canvas 3D M-RoPE (config.json carries the layout token ids)
    "text_model_type",       # config.json `text_config.model_type`: the only text tower vLLM builds
    "processor_classes",     # (processor, image processor, video processor) transformers maps it to
    "modelscope_id",         # the default download (scripts/download_weights.sh)
    "sources",               # where the facts above come from
])

MODELS = OrderedDict((m.model_type, m) for m in (
    Model(
        model_type="minicpmv4_6",
        name="MiniCPM-V 4.6",
        architecture="MiniCPMV4_6ForConditionalGeneration",
        transformers_config="MiniCPMV4_6Config",
        transformers_min="5.7.0",
        vllm_min="0.23.0",
        served_model_name="minicpm-v-4.6-thinking",
        # The Thinking checkpoint thinks; `enable_thinking: false` in its template empties the
        # reasoning. The Instruct checkpoint (OpenBMB/MiniCPM-V-4.6) is a separate download.
        thinking_switch=False,
        canvas_mrope=False,
        text_model_type="qwen3_5_text",
        processor_classes=("MiniCPMV4_6Processor", "MiniCPMV4_6ImageProcessor", "MiniCPMV4_6VideoProcessor"),
        modelscope_id="OpenBMB/MiniCPM-V-4.6-Thinking",
        sources="docs/design/model.md",
    ),
    Model(
        model_type="minicpmv4_7",
        name="MiniCPM-V 4.7",
        architecture="MiniCPMV4_7ForConditionalGeneration",
        transformers_config="MiniCPMV4_7Config",
        transformers_min="5.18.0",
        vllm_min="0.32.0",
        served_model_name="minicpm-v-4.7",
        thinking_switch=True,
        canvas_mrope=True,
        text_model_type="qwen3_5_text",
        # transformers 5.19 maps minicpmv4_7 to 4.6's image and video processors (its auto
        # mappings); an upstream draft has MiniCPMV4_7ImageProcessor / VideoProcessor instead.
        processor_classes=("MiniCPMV4_7Processor", "MiniCPMV4_6ImageProcessor", "MiniCPMV4_6VideoProcessor"),
        modelscope_id="OpenBMB/MiniCPM-V-4.7-1B",
        sources=("transformers 5.18.0 is the first wheel with models/minicpmv4_7 (5.17.0 has none); "
                 "vLLM 0.32.0's sdist is the first with model_executor/models/minicpmv4_7.py (0.31.0 has "
                 "none); the repository: OpenBMB's cookbook lists the 1B as `openbmb/MiniCPM-V-4.7-1B` "
                 "(https://github.com/OpenSQZ/MiniCPM-V-CookBook/blob/main/docs/pages/v4.7/overview.md; "
                 "transformers' docstring checkpoint `openbmb/MiniCPM-V-4.7` names no size) and Xinference "
                 "serves `openbmb/MiniCPM-V-4.7-1B` from Hugging Face and ModelScope "
                 "(https://inference.readthedocs.io/en/latest/models/builtin/llm/minicpm-v-4.7.html); "
                 "OPEN: the ModelScope page itself was not read, `OpenBMB/MiniCPM-V-4.7-1B` is that name "
                 "under OpenBMB's ModelScope organisation (as OpenBMB/MiniCPM-V-4.6-Thinking) "
                 "(docs/design/model.md)"),
    ),
))
DEFAULT_MODEL_TYPE = "minicpmv4_6"

# vLLM's 4.6 class (which 4.7 subclasses) builds the dense Qwen3_5ForCausalLM whatever the text
# config says (vllm/model_executor/models/minicpmv4_6.py, vLLM 0.32): a checkpoint with another
# text tower, such as 4.7's MoE (MiniCPM-V-4.7-35B-A3B, `qwen3_5_moe_text`), is no model it serves.
# A hub id names a MoE by its active parameters ("-A3B"), as OpenBMB and Qwen name them.
_MOE_ID = re.compile(r"-a\d+(\.\d+)?b(?![a-z0-9])")
_FAMILY_ID = re.compile(r"minicpm-?v-?(\d+)[._](\d+)(?![0-9])")


def model_for_config(config):
    """The declared model a config.json (a dict) describes, or None."""
    if not isinstance(config, dict):
        return None
    model = MODELS.get(config.get("model_type"))
    if model is not None:
        return model
    architectures = config.get("architectures") or []
    for model in MODELS.values():
        if model.architecture in architectures:
            return model
    return None


def version_tuple(version):
    """'0.32.0rc1' -> (0, 32, 0): the release numbers, enough to compare with a model's minimum."""
    parts = []
    for piece in str(version).split(".")[:3]:
        digits = ""
        for char in piece:
            if not char.isdigit():
                break
            digits += char
        parts.append(int(digits or 0))
        if digits != piece:
            break
    return tuple(parts + [0] * (3 - len(parts)))


def _family(text):
    """'OpenBMB/MiniCPM-V-4.7-1B' or 'MiniCPM-V 4.7' -> '4.7'; None when it names no version."""
    match = _FAMILY_ID.search(str(text).lower().replace(" ", "-"))
    return "{}.{}".format(*match.groups()) if match else None


def model_for_id(model_id):
    """(declared model, is it that model's declared download) for a hub id, or (None, False) when
    it names no declared MiniCPM-V version: 'OpenBMB/MiniCPM-V-4.7-1B' -> (4.7, True),
    'openbmb/MiniCPM-V-4.7' -> (4.7, False). Before the download no config.json says more."""
    for model in MODELS.values():
        if model.modelscope_id.lower() == str(model_id).lower():
            return model, True
    family = _family(str(model_id).rpartition("/")[2])
    for model in MODELS.values():
        if family is not None and family == _family(model.name):
            return model, False
    return None, False


def is_moe_id(model_id):
    """Whether a hub id names a mixture-of-experts model by its active parameters ('-35B-A3B')."""
    return _MOE_ID.search(str(model_id).rpartition("/")[2].lower()) is not None
