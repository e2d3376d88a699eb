"""A transparent proxy for an engine's async result stream that finalizes its request once.

A stream can end five ways: exhausted, raised, closed by the consumer (``aclose``/``break``),
cancelled with its task, or dropped and garbage-collected. Each must end the request's telemetry
exactly once and give back its in-flight slot; the consumer must see the engine's own objects and
exceptions, untouched.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol

import wrapt

from otel_rollout.record import StreamClosedEarly


class StreamObserver(Protocol):
    def item(self, item: Any) -> None: ...

    def finish(self, error: BaseException | None) -> None: ...


class ObservedAsyncStream(wrapt.ObjectProxy):  # type: ignore[type-arg]  # wrapt 2 is generic, 1.x not
    def __init__(self, wrapped: Any, observer: StreamObserver) -> None:
        super().__init__(wrapped)
        self._self_observer = observer
        self._self_done = False

    def _self_finish(self, error: BaseException | None) -> None:
        if not self._self_done:
            self._self_done = True
            self._self_observer.finish(error)

    def __aiter__(self) -> ObservedAsyncStream:
        return self

    async def _self_advance(self, step: Awaitable[Any]) -> Any:
        """Await one step of the wrapped generator; observe what it yields or how it ended."""
        try:
            item = await step
        except StopAsyncIteration:
            self._self_finish(None)
            raise
        except BaseException as exc:
            self._self_finish(exc)
            raise
        self._self_observer.item(item)
        return item

    async def __anext__(self) -> Any:
        # The hot path (every chunk of every stream): one coroutine, not two as via _self_advance.
        try:
            item = await self.__wrapped__.__anext__()
        except StopAsyncIteration:
            self._self_finish(None)
            raise
        except BaseException as exc:
            self._self_finish(exc)
            raise
        self._self_observer.item(item)
        return item

    def asend(self, value: Any) -> Awaitable[Any]:
        return self._self_advance(self.__wrapped__.asend(value))

    def athrow(self, *args: Any) -> Awaitable[Any]:
        # The generator may handle the throw and yield on: that item is observed like any other.
        return self._self_advance(self.__wrapped__.athrow(*args))

    async def aclose(self) -> None:
        try:
            await self.__wrapped__.aclose()
        finally:
            self._self_finish(StreamClosedEarly("the consumer closed the stream before it ended"))

    def __del__(self) -> None:
        if not self._self_done:
            self._self_finish(StreamClosedEarly("the stream was abandoned before it ended"))
