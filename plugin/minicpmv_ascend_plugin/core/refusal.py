"""The shape of the `*-400` patches: vLLM answers a client's bad input with a 5xx (an exception its
error handler does not map to 400); the patch refuses that input first with a `ValueError`, which
vLLM answers 400, with a message that says what to send instead.

- `raised_by` calls vLLM's own function (not this plugin's wrapper of it) with the bad input and
  returns what it raised; `decide` turns that into the predicate's answer.
- `refuse` wraps the function (sync or async alike): a `before` check of the arguments, a `catch`
  of vLLM's exception, an `after` check of the result; each message becomes the ValueError.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from .patch import LayoutNotFound
from .wrap import wrap_once

Check = Callable[..., "str | None"]  # a message (refuse) or None (let it through)


def raised_by(owner: Any, attr: str, call: Callable[[Callable[..., Any]], Any]) -> BaseException | None:
    """What `call(vLLM's own owner.attr)` raises (None: nothing)."""
    function = getattr(owner, attr)
    function = getattr(function, "_minicpmv_ascend_plugin_wraps", function)  # vLLM's, not ours
    try:
        call(function)
    except Exception as error:  # noqa: BLE001 - the exception type is what is probed
        return error
    return None


def decide(error: BaseException | None, owner: Any, attr: str, server_error: type[BaseException], bad_input: str,
           unprobeable: tuple[type[BaseException], ...] = (TypeError, AttributeError)) -> str | None:
    """The predicate: None (apply) while vLLM raises `server_error` for the bad input; the reason
    otherwise; `LayoutNotFound` when the probe no longer fits vLLM's function (`unprobeable`)."""
    if isinstance(error, unprobeable):
        raise LayoutNotFound(f"vLLM's {owner.__name__}.{attr} cannot be probed: {type(error).__name__}: {error}")
    if not isinstance(error, server_error):
        return f"vLLM refuses {bad_input} with {type(error).__name__}, not {server_error.__name__}"
    return None


def refuse(owner: Any, attr: str, *, before: Check | None = None,
           catch: tuple[type[BaseException], Callable[[BaseException], str]] | None = None,
           after: Callable[[Any], str | None] | None = None) -> bool:
    """Wrap `owner.attr` (once) so that what it would answer with a 5xx is a `ValueError` (400):
    `before(*args, **kwargs)`, `catch = (exception type, message of the exception)`,
    `after(result)`; each returns the message, or None to let the call through."""

    def check_before(args: tuple, kwargs: dict) -> None:
        message = before(*args, **kwargs) if before else None
        if message:
            raise ValueError(message)

    def check_after(result: Any) -> Any:
        message = after(result) if after else None
        if message:
            raise ValueError(message)
        return result

    def make(original: Any) -> Any:
        caught = catch[0] if catch else ()

        if inspect.iscoroutinefunction(original):
            @functools.wraps(original)
            async def refused_async(*args: Any, **kwargs: Any) -> Any:
                check_before(args, kwargs)
                try:
                    result = await original(*args, **kwargs)
                except caught as error:
                    raise ValueError(catch[1](error)) from error
                return check_after(result)

            return refused_async

        @functools.wraps(original)
        def refused(*args: Any, **kwargs: Any) -> Any:
            check_before(args, kwargs)
            try:
                result = original(*args, **kwargs)
            except caught as error:
                raise ValueError(catch[1](error)) from error
            return check_after(result)

        return refused

    return wrap_once(owner, attr, make)
