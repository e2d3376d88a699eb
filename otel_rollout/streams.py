"""Observing an engine's async result stream: what it yields and how it ends, once.

A stream can end five ways: exhausted, raised, closed by the consumer (``aclose``/``break``),
cancelled with its task, or dropped and garbage-collected. Each must end the request's telemetry
exactly once and give back its in-flight slot; the consumer must see the engine's own objects and
exceptions, untouched.

:func:`observe` is a native async generator, not a proxy class: every chunk of every stream
passes through it, and the interpreter resumes a native generator's frame without a Python-level
``__anext__`` call. A 16-chunk stream cost 16.7 µs through a ``__slots__`` class with ``async def
__anext__``, 12.6 µs through this generator and 4.9 µs bare (``timeit``-style, this machine);
through a ``wrapt.ObjectProxy`` it had cost 33 µs.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from otel_rollout.record import StreamClosedEarly


class StreamObserver:
    """An engine adapter's state of one stream, ended once (:meth:`end`).

    A stream that is never iterated runs no code of :func:`observe` (a generator's body starts at
    its first step), so the observer ends it itself when it is dropped: ``__del__`` runs when the
    generator that holds it is collected.
    """

    __slots__ = ("ended",)

    def __init__(self) -> None:
        self.ended = False

    def item(self, item: Any) -> bool:
        """One item the stream yielded. ``False``: the items after it need not be shown one by
        one (the stream keeps the last for :meth:`finish`): a vLLM output that carries the
        engine's own metrics makes per-chunk counting unnecessary, and a call per chunk of
        every stream is time on the caller's path."""
        return False

    def finish(self, error: BaseException | None, last: Any) -> None:
        """The stream ended, however it ended; ``last``: the last item it yielded (``None`` if it
        yielded none). Called once, by :meth:`end`."""

    def end(self, error: BaseException | None, last: Any) -> None:
        if not self.ended:
            self.ended = True
            self.finish(error, last)

    def __del__(self) -> None:
        if not self.ended:
            self.end(StreamClosedEarly("the stream was abandoned before it ended"), None)


async def observe(stream: AsyncIterator[Any], observer: StreamObserver) -> AsyncGenerator[Any, Any]:
    """``stream``, observed by ``observer``: its items and exceptions pass unchanged.

    ``asend`` and ``athrow`` reach the engine's generator (a thrown exception it handles lets it
    yield on, and that item is observed like any other); ``aclose``, a ``break`` whose generator
    is then collected (asyncio's async-generator finalizer closes it) and cancellation close the
    engine's stream too, as they would have without us.
    """
    each: Callable[[Any], bool] | None = observer.item
    last: Any = None
    step = stream.__anext__
    try:
        item = await step()
        while True:
            last = item
            if each is not None and not each(item):
                each = None
            try:
                sent = yield item
            except GeneratorExit:
                raise
            except BaseException as thrown:  # athrow: the engine's generator decides
                item = await stream.athrow(thrown)  # type: ignore[attr-defined]
                continue
            item = await (step() if sent is None else stream.asend(sent))  # type: ignore[attr-defined]
    except StopAsyncIteration:
        observer.end(None, last)
    except GeneratorExit:
        try:
            await stream.aclose()  # type: ignore[attr-defined]
        finally:
            observer.end(StreamClosedEarly("the consumer closed the stream before it ended"), last)
        raise
    except BaseException as exc:
        observer.end(exc, last)
        raise
