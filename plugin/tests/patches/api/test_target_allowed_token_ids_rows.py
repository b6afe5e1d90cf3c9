"""allowed-token-ids-rows on the target's own `InputBatch` (vllm-ascend's `NPUInputBatch` extends it
and overrides only `__init__`: these are the methods its model runner runs).

Each scenario is what the model runner does between steps: `add_request`, `remove_request`, then
`condense` (or an attention backend's `swap_states`). A row of `allowed_token_ids_mask_cpu_tensor`
is True where a token is masked out; a request without `allowed_token_ids` must have a row of
False whenever the mask is applied (while any request in the batch uses `allowed_token_ids`).
Without the patch vLLM's own code leaves the other request's mask on the row; with it, none.
"""

from __future__ import annotations

import textwrap

from _target import results_each
from minicpmv_ascend_plugin.core.registry import DISABLE_ENV
from minicpmv_ascend_plugin.patches.api import allowed_token_ids_rows as patch

VOCAB = 16
ALLOWED = [3, 5]  # A's allowed tokens: every other token is masked on A's row

CODE = textwrap.dedent(f"""
    import inspect, json, sys
    import torch
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from vllm.sampling_params import SamplingParams
    from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch
    for name in ("vllm.v1.worker.gpu_input_batch", "vllm.v1.worker.block_table"):  # 0.30 reads no argument:
        if hasattr(sys.modules.get(name), "PIN_MEMORY"):  # no pinned memory without an accelerator
            sys.modules[name].PIN_MEMORY = False

    def batch():
        wanted = dict(max_num_reqs=4, max_model_len=32, max_num_batched_tokens=32, device=torch.device("cpu"),
                      pin_memory=False, vocab_size={VOCAB}, block_sizes=[16], kernel_block_sizes=[16],
                      max_num_blocks_per_req=[2])
        accepted = inspect.signature(InputBatch).parameters  # the targets' constructors differ
        return InputBatch(**{{k: v for k, v in wanted.items() if k in accepted}})

    def request(req_id, allowed=None):
        return CachedRequestState(req_id=req_id, prompt_token_ids=[1, 2], mm_features=[],
                                  sampling_params=SamplingParams(allowed_token_ids=allowed), generator=None,
                                  block_ids=([],), num_computed_tokens=0, output_token_ids=[])

    def masked(b, req_id):  # the tokens masked on that request's row
        row = b.allowed_token_ids_mask_cpu_tensor[b.req_id_to_index[req_id]]
        return row.nonzero().flatten().tolist()

    result = {{"wrapped": hasattr(InputBatch.condense, "_minicpmv_ascend_plugin_wraps")}}

    def step(b):  # the end of the model runner's batch update, once per step
        b.condense()
        b.refresh_metadata()

    # condense: X (row 0) and A (row 1, allowed_token_ids); X finishes, A moves down to row 0;
    # B (no allowed_token_ids) is added at row 1, the row A left.
    b = batch()
    b.add_request(request("X"))
    b.add_request(request("A", {ALLOWED}))
    step(b)
    b.remove_request("X")
    step(b)
    b.add_request(request("B"))
    step(b)
    result["B_after_add"] = masked(b, "B")
    result["A_after_add"] = masked(b, "A")
    result["mask_applied"] = not b.no_allowed_token_ids
    # A finishes and B is condensed into row 0, the row A had; then C (allowed_token_ids) joins.
    b.remove_request("A")
    step(b)
    b.add_request(request("C", {ALLOWED}))
    step(b)
    result["B_row"] = b.req_id_to_index["B"]
    result["B_after_condense"] = masked(b, "B")

    # swap_states (the decode/prefill reordering): B (row 0, no allowed_token_ids), A (row 1).
    b = batch()
    b.add_request(request("B"))
    b.add_request(request("A", {ALLOWED}))
    step(b)
    b.swap_states(0, 1)  # what the reordering's caller keeps in step with the swap
    result["swap_A"] = masked(b, "A")
    result["swap_B"] = masked(b, "B")
    print("RESULT " + json.dumps(result))
""")


def test_no_request_keeps_another_requests_allowed_token_ids(target):
    assert target.needs(patch.NAME), "a target whose InputBatch has the fix: add its expectations"
    a_mask = [t for t in range(VOCAB) if t not in ALLOWED]
    without, with_patch = results_each(CODE, {DISABLE_ENV: f"off:{patch.NAME}"}, None)
    # vLLM's own code: B inherits A's mask, applied because A is in the batch; the swap gives both
    # rows A's.
    assert not without["wrapped"]
    assert without["A_after_add"] == a_mask and without["mask_applied"], without
    assert without["B_after_add"] == a_mask, without
    assert without["B_row"] == 0 and without["B_after_condense"] == a_mask, without
    assert (without["swap_A"], without["swap_B"]) == (a_mask, a_mask), without
    # With the patch: B is never masked, A keeps its own mask.
    assert with_patch["wrapped"]
    assert with_patch["A_after_add"] == a_mask and with_patch["mask_applied"], with_patch
    assert with_patch["B_after_add"] == with_patch["B_after_condense"] == [], with_patch
    assert (with_patch["swap_A"], with_patch["swap_B"]) == (a_mask, []), with_patch
