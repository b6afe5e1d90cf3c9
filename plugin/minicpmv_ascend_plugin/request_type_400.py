"""A request field of the wrong JSON type that crashes one of vLLM's request validators is a 400.

Bug (vLLM 0.23, 0.30 and 0.32; found by `make fuzz` on 0.32): the request models'
`check_structured_outputs_count` (`entrypoints/openai/completion/protocol.py` and
`chat_completion/protocol.py`, a pydantic `model_validator(mode="before")`) calls `.get()` on `structured_outputs` whatever its type. A
well-formed JSON body with `"structured_outputs": []` (or a string, a number) raises
`AttributeError` inside pydantic, which is not a `ValidationError`, so FastAPI does not turn it
into a 400: vLLM answers **500** "'list' object has no attribute 'get'" on /v1/completions,
/v1/chat/completions and /v1/chat/completions/batch. Upstream: vllm-project/vllm PR #44537 (open;
not in 0.32 / 0.33).

Fix: FastAPI's `ModelField.validate` (what validates every request body against its model) is
wrapped: an `AttributeError`, `TypeError` or `KeyError` out of the model's validators becomes a
validation error, which vLLM answers as 400 like every other one. `POST /invocations` (vLLM's
SageMaker route, 0.23 - 0.32) validates the body itself, trying one `pydantic.TypeAdapter` per
request type and catching only `ValidationError`: its adapters are built from a TypeAdapter whose
`validate_python` turns the same three errors into a `ValidationError`, so the route tries the next
type and answers its own 400 "Cannot find suitable handler for request" instead of a 500. The
message names the field when it is one of the known cases (`structured_outputs` must be a JSON
object such as {"regex": "..."}), else it says which body field types to check. Bodies that
validate, and every other error, are untouched.

Applies when: vLLM's completion request model reads `structured_outputs` with `.get(` in
`check_structured_outputs_count` and never checks that it is a dict (read from vLLM's source,
without importing it). Only processes that import FastAPI (the API server) are changed.
Delete when: vLLM checks the type there (a list is then its own 400).
"""

from __future__ import annotations

import functools
import re
from typing import Any

from ._base import AT_REGISTER, Patch, function_source, wrap_once
from ._import_hook import when_imported

NAME = "request-type-400"
PROTOCOL_FILES = ("entrypoints/openai/completion/protocol.py", "entrypoints/openai/protocol.py")  # 0.32, 0.23
# FastAPI's request-body field, by FastAPI version (>= 0.119 has the pydantic-v2 module).
FASTAPI_MODULES = ("fastapi._compat.v2", "fastapi._compat")
INVOCATIONS_ROUTER = "vllm.entrypoints.serve.sagemaker.api_router"  # 0.23 - 0.32
OBJECT_FIELDS = {
    "structured_outputs": 'a JSON object with one constraint, e.g. {"regex": "[0-9]+"}, {"choice": ["a", "b"]} '
                          'or {"json": {...}}',
}


def message(body: Any, error: BaseException) -> tuple[tuple[str, ...], str]:
    """(loc, message) for a body whose validation raised `error`."""
    if isinstance(body, dict):
        for field, expected in OBJECT_FIELDS.items():
            value = body.get(field)
            if value is not None and not isinstance(value, dict):
                return (field,), f"`{field}` must be {expected}; got {type(value).__name__}"
    return (), (f"invalid request body: a field has an unexpected JSON type ({type(error).__name__}: {error}); "
                "check the types of the fields against the API reference")


def _validate(original: Any) -> Any:
    @functools.wraps(original)
    def validate(self: Any, value: Any, values: Any = {}, *, loc: tuple[Any, ...] = ()) -> Any:  # noqa: B006
        try:
            return original(self, value, values, loc=loc)
        except (AttributeError, TypeError, KeyError) as error:
            where, text = message(value, error)
            return None, [{"type": "value_error", "loc": (*loc, *where), "msg": text,
                           "input": value.get(where[0]) if where and isinstance(value, dict) else None,
                           "ctx": {"error": text}}]

    return validate


def _guarded_adapter() -> type:
    import pydantic
    import pydantic_core

    class GuardedTypeAdapter(pydantic.TypeAdapter):  # type: ignore[misc]
        def validate_python(self, body: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().validate_python(body, *args, **kwargs)
            except (AttributeError, TypeError, KeyError) as error:
                where, text = message(body, error)
                raise pydantic_core.ValidationError.from_exception_data(
                    "request", [{"type": "value_error", "loc": where, "input": None,
                                 "ctx": {"error": ValueError(text)}}]) from error

    return GuardedTypeAdapter


def _guard_invocations(module: Any) -> None:
    """Give vLLM's /invocations router a `pydantic` whose TypeAdapter is the guarded one."""
    import pydantic

    real = getattr(module, "pydantic", None)
    if real is not pydantic:  # not vLLM 0.32's layout, or already done
        return
    namespace = type("pydantic_for_invocations", (), {"__getattr__": staticmethod(lambda name: getattr(pydantic, name)),
                                                      "TypeAdapter": _guarded_adapter()})
    module.pydantic = namespace()


def check(_: Any) -> str | None:
    found = function_source("check_structured_outputs_count", *PROTOCOL_FILES)
    path, body = found
    if ".get(" not in body:
        return f"vLLM's {path} check_structured_outputs_count does not call .get()"
    if re.search(r"isinstance\(\s*structured_outputs\w*\s*,\s*dict", body):
        return f"vLLM's {path} checks that structured_outputs is a dict"
    return None


def apply(_: Any) -> None:
    for module in FASTAPI_MODULES:
        when_imported(module, lambda m: hasattr(m, "ModelField") and wrap_once(m.ModelField, "validate", _validate))
    when_imported(INVOCATIONS_ROUTER, _guard_invocations)


# plugin/README.md's "Details and evidence" for this patch (Markdown; scripts/patch_table.py renders it).
DETAILS = r"""
wraps FastAPI's `ModelField.validate` (`fastapi._compat.v2`, or
`fastapi._compat` on older FastAPI), which validates every request body against vLLM's model:
an `AttributeError`, `TypeError` or `KeyError` out of the model's validators becomes a validation
error, which vLLM answers 400 like the others; for `structured_outputs` the message says it must
be a JSON object such as `{"regex": "[0-9]+"}` and what it got. `/invocations` (the SageMaker
route, `serve/sagemaker/api_router.py` in 0.23, 0.30 and 0.32) validates the body with its own `pydantic.TypeAdapter`s and catches only
`ValidationError`: its router module gets a `pydantic` whose `TypeAdapter.validate_python` raises
`ValidationError` for those three errors, so it answers its own 400. Predicate: vLLM's completion
protocol source has a `check_structured_outputs_count` that calls `.get(` with no
`isinstance(..., dict)` check (0.23, 0.30 and 0.32 alike).
"""

PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary="a body field of the wrong JSON type that crashes a request validator (e.g. structured_outputs: []) "
    "is a 400 naming the field, not a 500",
    upstream="vllm/entrypoints/openai/*/protocol.py check_structured_outputs_count calls .get() on any type (0.23-0.32)",
    check=check,
    apply=apply,
    fixes=('a body field of the wrong JSON type that crashes a request validator (`"structured_outputs": []`, a string, a '
     'number) gets **500** "\'list\' object has no attribute \'get\'" on completions and chat (found by `make fuzz`)'),
    references='vLLM PR #44537 (open)',
    tests=('`tests/test_fuzz_findings.py::test_request_type_400_bug_without_and_fix_with_the_plugin`, '
     "`plugin/tests/test_fuzz_findings.py` (each target's request model, chat parser and Responses converter); the "
     'server answers 400 (`test_the_fuzzers_request_is_answered_on_the_server`)'),
    delete_when='vLLM checks the type of `structured_outputs`',
    details=DETAILS,
    evidence={"0.30.0": ('applied', ('`entrypoints/openai/completion/protocol.py:460-474` (and '
                         '`chat_completion/protocol.py:870`): `check_structured_outputs_count` calls `.get()` on '
                         "`structured_outputs` of any type: `AttributeError` through FastAPI's body field"))},
)
