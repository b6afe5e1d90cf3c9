"""One request's `allowed_token_ids` mask never stays on, or moves to, another request's batch row."""

from __future__ import annotations

import functools
import re
from typing import Any

from ...core.patch import AT_REGISTER, LayoutNotFound, Patch
from ...core.vllm_code import function_source
from ...core.wrap import wrap_when_imported

NAME = "allowed-token-ids-rows"
INPUT_BATCH = "v1/worker/gpu_input_batch.py"
OWNER = "InputBatch"
MASK = "allowed_token_ids_mask_cpu_tensor"
# What the predicate looks for in each method's source (whitespace removed):
CONDENSE_COPY = f"self.{MASK}[empty_index]=(self.{MASK}[last_req_index])"  # condense moves a row down
CONDENSE_FIX = f"self.{MASK}[last_req_index].fill_(False)"  # ... and clears the row it left (the fix)
SWAP_VIEWS = f"(self.{MASK}[i1],self.{MASK}[i2],)=(self.{MASK}[i2],self.{MASK}[i1],)"  # swap through views
SWAP_FIX = f"self.{MASK}[[i1,i2]]"  # swap by a copying (advanced) index (the fix)


def _compact(text: str) -> str:
    return re.sub(r"\s+", "", text)


def flaws() -> dict[str, bool]:
    """Whether vLLM's `InputBatch.condense` and `InputBatch.swap_states` have the flaw (read from
    its source without importing it); `LayoutNotFound` where either is in neither shape."""
    found = {}
    for method, flaw, fix in (("condense", CONDENSE_COPY, CONDENSE_FIX), ("swap_states", SWAP_VIEWS, SWAP_FIX)):
        path, source = function_source(method, INPUT_BATCH)
        source = _compact(source)
        if fix in source:
            found[method] = False
        elif flaw in source:
            found[method] = True
        else:
            raise LayoutNotFound(f"vLLM's {path} {OWNER}.{method} handles `{MASK}` in neither the flawed nor "
                                 "the fixed shape")
    return found


def _condense(original: Any) -> Any:
    @functools.wraps(original)
    def condense(self: Any) -> None:
        rows_in_use = len(self._req_ids)
        original(self)
        mask = getattr(self, MASK, None)
        if mask is not None and rows_in_use > self.num_reqs:
            # Every row past the condensed batch is empty now: the rows of removed requests (already
            # cleared) and the rows whose requests condense moved down (still holding their masks).
            mask[self.num_reqs:rows_in_use].fill_(False)

    return condense


def _swap_states(original: Any) -> Any:
    @functools.wraps(original)
    def swap_states(self: Any, i1: int, i2: int) -> None:
        mask = getattr(self, MASK, None)
        rows = mask[[i1, i2]] if mask is not None else None  # an advanced index copies
        original(self, i1, i2)
        if rows is not None:
            mask[[i2, i1]] = rows

    return swap_states


def check(_: Any) -> str | None:
    if not any(flaws().values()):
        return (f"vLLM's {OWNER}.condense clears the row it moves a request from, and swap_states swaps "
                f"`{MASK}` rows by copy")
    return None


def apply(_: Any) -> None:
    wrap_when_imported((INPUT_BATCH,), f"{OWNER}.condense", _condense)
    wrap_when_imported((INPUT_BATCH,), f"{OWNER}.swap_states", _swap_states)


PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary=("a request without `allowed_token_ids` gets no other request's allowed-token mask (condense "
             "clears the rows it empties, swap_states swaps rows by copy)"),
    upstream=(f"vLLM #43894; fixed in 0.31.0 (GHSA-6cxc-2vcg-w5qc), 0.32's `{OWNER}` has both fixes; "
              f"`{INPUT_BATCH}` {OWNER} (0.23-0.30)"),
    check=check,
    apply=apply,
    fixes=(f"`{OWNER}.condense` copies a moved request's `{MASK}` row down and leaves the row it came from as it "
           "was; the next request added there without `allowed_token_ids` keeps that mask, and while any "
           "request in the batch uses `allowed_token_ids` it is sampled from the other client's allowed "
           f"tokens only. `swap_states` swaps two rows through views: both end up with the second row's mask"),
    tests=("`plugin/tests/patches/api/test_target_allowed_token_ids_rows.py` (each target's own "
           f"`{OWNER}`: "
           "a condense sequence and a swap leave another request's mask on a row without the patch, none "
           "with it)"),
    delete_when=(f"`{OWNER}.condense` clears the row it moves from and `swap_states` copies the rows (as "
                 "vLLM 0.32's do)"),
    details=f"""
vllm-ascend's `NPU{OWNER}` (`vllm_ascend/worker/npu_input_batch.py`, and the 310P one that
extends it) subclasses vLLM's `{OWNER}` and overrides only `__init__`: its model runner calls
vLLM's `_update_states`, hence vLLM's `condense`, and its MLA/DSA/GDN decode-prefill reordering
calls vLLM's `swap_states`. So the patch wraps vLLM's two methods (`{INPUT_BATCH}`, when a worker
imports it): after `condense`, the rows between the condensed batch's size and the rows in use
before it are cleared (`fill_(False)`: nothing masked), as vLLM 0.32 clears each row it moves a
request from; `swap_states` copies the two `{MASK}` rows before vLLM's swap and writes them back
exchanged. Predicate: vLLM's source of the two methods (read without importing it) copies the row
down without `{CONDENSE_FIX}`, or swaps through the views
`{SWAP_VIEWS}`; with `{CONDENSE_FIX}` and `{SWAP_FIX}` the fix is there.
""",
    evidence={"0.30.0": ("applied", (f"`{INPUT_BATCH}:819-822`: `condense` copies the `{MASK}` row of "
                                     "`last_req_index` to `empty_index` and never clears it; `:690-697`: "
                                     "`swap_states` swaps the two rows through views; `add_request` (`:444-465`) "
                                     "writes the row only for a request with `allowed_token_ids`"))},
)
