"""The plugin's `vit-varlen-attention` on the CPU stack's vLLM 0.32 code (its Idefics2 encoder still
pads and masks sliced images): plugin/tests/vit_varlen_check.py run in a process of its own, for
MiniCPM-V 4.6 and for 4.7, whose model class inherits `get_vision_hidden_states` (so the patch,
wrapping 4.6's method, covers it). The same checks run on each Ascend target's vLLM in
plugin/tests/patches/model/test_target_vit_varlen_attention.py; end to end, tests/test_parity.py runs with the patch on.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import vit_varlen_check
from support.server import REPO, clean_env


@pytest.mark.slow
def test_vit_varlen_attention_on_vllm_032_for_46_and_47(tiny_checkpoint):
    proc = subprocess.run([sys.executable, str(REPO / "plugin" / "tests" / "vit_varlen_check.py"),
                           str(tiny_checkpoint)], capture_output=True, text=True, timeout=1200,
                          env=clean_env(HF_HUB_OFFLINE="1"), cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT ")).removeprefix("RESULT "))
    vit_varlen_check.verify(result["4.6"])
    assert result["4.7"]["class"] == "MiniCPMV4_7ForConditionalGeneration" and result["4.7"]["inherits"]
    vit_varlen_check.verify(result["4.7"], modes=("16x",), controls=False)
