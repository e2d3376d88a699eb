"""An observing wrapper around an engine's async result stream that finalizes its request once.

A stream can end five ways: exhausted, raised, closed by the consumer (``aclose``/``break``),
cancelled with its task, or dropped and garbage-collected. Each must end the request's telemetry
exactly once and give back its in-flight slot; the consumer must see the engine's own objects and
exceptions, untouched.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from otel_rollout.record import StreamClosedEarly


class StreamObserver(Protocol):
    def item(self, item: Any) -> bool:
        """One item the stream yielded. ``False``: the items after it need not be shown one by
        one (the stream keeps the last for :meth:`finish`): a vLLM output that carries the
        engine's own metrics makes per-chunk counting unnecessary, and a call per chunk of
        every stream is time on the caller's path."""
        ...

    def finish(self, error: BaseException | None, last: Any) -> None:
        """The stream ended, once, however it ended; ``last``: the last item it yielded
        (``None`` if it yielded none)."""
        ...


class ObservedAsyncStream:
    """The engine's stream, observed: what it yields and how it ends.

    A plain ``__slots__`` class, not a ``wrapt.ObjectProxy``: every chunk of every stream passes
    through ``__anext__``, and reading the proxy's own attributes there cost about 1 µs a chunk
    (a 16-chunk stream: 33 µs through the proxy, 16 µs through this class, 5 µs bare; measured
    with ``timeit`` on this machine). What a consumer of a stream uses is kept: iteration,
    ``asend`` / ``athrow`` / ``aclose``, and ``__class__`` (so ``isinstance`` and
    ``inspect.isasyncgen`` answer as for the engine's own generator), and an async generator's
    own attributes (``ag_running``, ``ag_frame``, …, :data:`FORWARDED`); ``__wrapped__`` is the
    stream itself. Not a ``__getattr__`` for the rest: it would slow every attribute read of
    this class, the hot path's included.
    """

    __slots__ = ("__weakref__", "__wrapped__", "_done", "_each", "_last", "_observer")

    def __init__(self, wrapped: Any, observer: StreamObserver) -> None:
        self.__wrapped__ = wrapped
        self._observer = observer
        self._each: Callable[[Any], bool] | None = observer.item
        """The observer's per-item call, until it says it needs no more (then ``None``)."""
        self._last: Any = None
        self._done = False

    @property  # type: ignore[misc]  # a proxy's class is its target's, as wrapt's proxies say
    def __class__(self) -> type:
        return type(self.__wrapped__)

    def __repr__(self) -> str:
        return f"<observed {self.__wrapped__!r}>"

    def _finish(self, error: BaseException | None) -> None:
        if not self._done:
            self._done = True
            self._observer.finish(error, self._last)

    def __aiter__(self) -> ObservedAsyncStream:
        return self

    async def _advance(self, step: Awaitable[Any]) -> Any:
        """Await one step of the wrapped generator; observe what it yields or how it ended."""
        try:
            item = await step
        except StopAsyncIteration:
            self._finish(None)
            raise
        except BaseException as exc:
            self._finish(exc)
            raise
        self._last = item
        each = self._each
        if each is not None and not each(item):
            self._each = None
        return item

    async def __anext__(self) -> Any:
        # The hot path (every chunk of every stream): one coroutine, not two as via _advance.
        try:
            item = await self.__wrapped__.__anext__()
        except StopAsyncIteration:
            self._finish(None)
            raise
        except BaseException as exc:
            self._finish(exc)
            raise
        self._last = item
        each = self._each
        if each is not None and not each(item):
            self._each = None
        return item

    def asend(self, value: Any) -> Awaitable[Any]:
        return self._advance(self.__wrapped__.asend(value))

    def athrow(self, *args: Any) -> Awaitable[Any]:
        # The generator may handle the throw and yield on: that item is observed like any other.
        return self._advance(self.__wrapped__.athrow(*args))

    async def aclose(self) -> None:
        try:
            await self.__wrapped__.aclose()
        finally:
            self._finish(StreamClosedEarly("the consumer closed the stream before it ended"))

    def __del__(self) -> None:
        if not self._done:
            self._finish(StreamClosedEarly("the stream was abandoned before it ended"))


FORWARDED = ("ag_await", "ag_code", "ag_frame", "ag_running")
"""The async generator's attributes an observed stream reads from the engine's own."""


def _forward(name: str) -> property:
    return property(lambda self: getattr(self.__wrapped__, name), doc=f"The stream's ``{name}``.")


for _name in FORWARDED:
    setattr(ObservedAsyncStream, _name, _forward(_name))
