"""The decorator form of a scope: every call of the function runs inside a fresh scope.

Shared by ``@rollout_step(...)`` and ``@rollout_phase(...)``: a coroutine function gets an
``async with`` around each awaited call (the scope then spans the call, not the creation of the
coroutine), any other function a ``with``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])


def each_call_in(func: F, scope: Callable[[], Any]) -> F:
    """``func`` with each call inside ``scope()`` (a sync and async context manager)."""
    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            async with scope():
                return await func(*args, **kwargs)

        return cast(F, async_wrapper)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with scope():
            return func(*args, **kwargs)

    return cast(F, wrapper)
