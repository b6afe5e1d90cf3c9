"""A request field of the wrong JSON type that crashes one of vLLM's request validators is a 400."""

from __future__ import annotations

import functools
import re
from typing import Any

from ...core.import_hook import when_imported
from ...core.patch import AT_REGISTER, Patch
from ...core.vllm_code import function_source
from ...core.wrap import wrap_when_imported

NAME = "request-type-400"
PROTOCOL_FILES = ("entrypoints/openai/completion/protocol.py", "entrypoints/openai/protocol.py")  # 0.32, 0.23
# FastAPI's request-body field, by FastAPI version (>= 0.119 has the pydantic-v2 module).
FASTAPI_MODULES = ("fastapi._compat.v2", "fastapi._compat")
INVOCATIONS_ROUTER = "vllm.entrypoints.serve.sagemaker.api_router"  # 0.23 - 0.32
VALIDATOR = "check_structured_outputs_count"  # calls .get() on structured_outputs of any type
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
    path, body = function_source(VALIDATOR, *PROTOCOL_FILES)
    if ".get(" not in body:
        return f"vLLM's {path} {VALIDATOR} does not call .get()"
    if re.search(r"isinstance\(\s*structured_outputs\w*\s*,\s*dict", body):
        return f"vLLM's {path} checks that structured_outputs is a dict"
    return None


def apply(_: Any) -> None:
    for module in FASTAPI_MODULES:
        wrap_when_imported(module, "ModelField.validate", _validate)
    when_imported(INVOCATIONS_ROUTER, _guard_invocations)


PATCH = Patch(
    name=NAME,
    stage=AT_REGISTER,
    summary="a body field of the wrong JSON type that crashes a request validator (e.g. structured_outputs: []) "
    "is a 400 naming the field, not a 500",
    upstream=f"vLLM PR #44537 (open); vllm/entrypoints/openai/*/protocol.py {VALIDATOR} calls .get() on any type "
             "(0.23-0.32)",
    check=check,
    apply=apply,
    fixes=('a body field of the wrong JSON type that crashes a request validator (`"structured_outputs": []`, a string, a '
     'number) gets **500** "\'list\' object has no attribute \'get\'" on completions and chat (found by `make fuzz`)'),
    tests=('`tests/test_fuzz_findings.py::test_request_type_400_bug_without_and_fix_with_the_plugin`, '
     "`plugin/tests/patches/api/test_target_fuzz_findings.py` (each target's request model, chat parser and Responses converter); the "
     'server answers 400 (`test_the_fuzzers_request_is_answered_on_the_server`)'),
    delete_when='vLLM checks the type of `structured_outputs`',
    details=f"""
the request models' `{VALIDATOR}` (a pydantic `model_validator(mode="before")`)
calls `.get()` on `structured_outputs` whatever its type: `"structured_outputs": []` raises
`AttributeError` inside pydantic, which is not a `ValidationError`, so FastAPI does not make it a
400 and vLLM answers 500 on /v1/completions, /v1/chat/completions and /v1/chat/completions/batch.
The patch wraps FastAPI's `ModelField.validate` (`{FASTAPI_MODULES[0]}`, or `{FASTAPI_MODULES[1]}`
on older FastAPI), which validates every request body against vLLM's model: an `AttributeError`,
`TypeError` or `KeyError` out of the model's validators becomes a validation error, which vLLM
answers 400 like the others; for `structured_outputs` the message says it must be
{OBJECT_FIELDS["structured_outputs"]}, and what it got. `/invocations` (the SageMaker route,
`{INVOCATIONS_ROUTER}` in 0.23, 0.30 and 0.32) validates the body with its own
`pydantic.TypeAdapter`s and catches only `ValidationError`: its router module gets a `pydantic`
whose `TypeAdapter.validate_python` raises `ValidationError` for those three errors, so it answers
its own 400. Bodies that validate, and every other error, are untouched; only processes that import
FastAPI (the API server) are changed. Predicate: vLLM's completion protocol source
(`{PROTOCOL_FILES[0]}`, 0.23: `{PROTOCOL_FILES[1]}`) has a `{VALIDATOR}` that calls `.get(` with no
`isinstance(..., dict)` check (0.23, 0.30 and 0.32 alike).
""",
    evidence={"0.30.0": ('applied', (f'`{PROTOCOL_FILES[0]}:460-474` (and '
                         f'`chat_completion/protocol.py:870`): `{VALIDATOR}` calls `.get()` on '
                         "`structured_outputs` of any type: `AttributeError` through FastAPI's body field"))},
)
