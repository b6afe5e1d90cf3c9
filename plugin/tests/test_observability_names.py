"""The metric table of the operator's rules and dashboard (minicpmv_ascend.tools.observability.METRICS,
rendered into docs/observability.md) against this target's own vLLM: every metric it says this
release exports is declared in its code, every one it says is absent is not, and the label values
the rules select on are spelt so (tests/test_observability.py does the same for the CPU stack's 0.32)."""

from __future__ import annotations

import pathlib
import sysconfig

from _target import Target
from minicpmv_ascend.tools import observability


def test_the_metric_table_holds_for_this_targets_vllm(target: Target) -> None:
    site_packages = pathlib.Path(sysconfig.get_paths()["purelib"])
    assert observability.problems_on(target.vllm, site_packages) == []
    exported = {m.name for m in observability.METRICS if target.vllm in m.releases}
    assert "vllm:time_to_first_token_seconds" in exported and "vllm:num_requests_waiting" in exported
