"""The observed stream on a plain async generator: each way a stream ends finishes it once, and a
consumer sees the engine's items, exceptions, ``asend`` and ``athrow``, in an async generator.

The engines' own streams go through the same :func:`observe` in tests/reliability/test_streams.py
(vLLM ``AsyncLLM``) and the SGLang suites; here every ending is driven directly, engine-free.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
from collections.abc import AsyncIterator
from typing import Any

import pytest

from otel_rollout.record import StreamClosedEarly
from otel_rollout.streams import StreamObserver, observe


class Observer(StreamObserver):
    def __init__(self) -> None:
        super().__init__()
        self.items: list[Any] = []
        self.ends: list[BaseException | None] = []
        self.lasts: list[Any] = []

    def item(self, item: Any) -> bool:
        self.items.append(item)
        return True

    def finish(self, error: BaseException | None, last: Any) -> None:
        self.ends.append(error)
        self.lasts.append(last)


class Boom(Exception):
    pass


async def numbers(n: int, fail: bool = False) -> AsyncIterator[int]:
    for i in range(n):
        try:
            yield i
        except Boom:
            yield -1  # handles a thrown exception and yields on
    if fail:
        raise Boom("the engine's own")


def run(coro: Any) -> Any:
    return asyncio.new_event_loop().run_until_complete(coro)


def test_exhausted_stream_yields_the_engines_items_and_finishes_once() -> None:
    observer = Observer()

    async def consume() -> list[int]:
        return [i async for i in observe(numbers(3), observer)]

    assert run(consume()) == [0, 1, 2]
    assert observer.items == [0, 1, 2] and observer.ends == [None] and observer.lasts == [2]


def test_an_observer_that_needs_no_more_items_still_gets_the_last() -> None:
    """vLLM's outputs with the engine's metrics: the first chunk says enough; the stream goes on
    unobserved per chunk, and the end still gets its last item."""

    class FirstOnly(Observer):
        def item(self, item: Any) -> bool:
            super().item(item)
            return False

    observer = FirstOnly()

    async def consume() -> list[int]:
        return [i async for i in observe(numbers(4), observer)]

    assert run(consume()) == [0, 1, 2, 3]
    assert observer.items == [0] and observer.ends == [None] and observer.lasts == [3]


def test_a_stream_that_yields_nothing_ends_with_no_last_item() -> None:
    observer = Observer()

    async def consume() -> list[int]:
        return [i async for i in observe(numbers(0), observer)]

    assert run(consume()) == [] and observer.ends == [None] and observer.lasts == [None]


def test_the_engines_exception_passes_unchanged() -> None:
    observer = Observer()
    stream = observe(numbers(1, fail=True), observer)

    async def consume() -> None:
        async for _ in stream:
            pass

    with pytest.raises(Boom, match="the engine's own") as raised:
        run(consume())
    assert observer.ends == [raised.value]


def test_aclose_finishes_as_closed_early_and_closes_the_engines_stream() -> None:
    closed = Observer()
    inner = numbers(5)

    async def close_after_one() -> None:
        stream = observe(inner, closed)
        await stream.__anext__()
        await stream.aclose()
        await stream.aclose()  # twice: still one finish

    run(close_after_one())
    assert len(closed.ends) == 1 and isinstance(closed.ends[0], StreamClosedEarly)
    assert closed.lasts == [0] and inner.ag_frame is None  # the engine's generator closed too


def test_a_stream_never_iterated_finishes_when_dropped() -> None:
    """Its generator runs no code: the observer, held only by it, ends it when collected."""
    abandoned = Observer()
    ends = abandoned.ends
    stream = observe(numbers(5), abandoned)
    del abandoned
    assert ends == []
    del stream
    gc.collect()
    assert len(ends) == 1 and isinstance(ends[0], StreamClosedEarly)


def test_a_stream_dropped_after_a_break_is_closed_by_asyncio() -> None:
    """``break`` leaves the generator suspended; asyncio's async-generator finalizer closes it
    when it is collected, and the engine's stream with it."""
    observer = Observer()
    inner = numbers(5)
    loop = asyncio.new_event_loop()

    async def break_early() -> None:
        async for _ in observe(inner, observer):
            break

    loop.run_until_complete(break_early())
    gc.collect()
    loop.run_until_complete(asyncio.sleep(0))  # the finalizer's aclose runs in the loop
    loop.close()
    assert len(observer.ends) == 1 and isinstance(observer.ends[0], StreamClosedEarly)
    assert observer.lasts == [0] and inner.ag_frame is None


def test_athrow_reaches_the_generator_and_what_it_yields_is_observed() -> None:
    observer = Observer()

    async def throw() -> int:
        stream = observe(numbers(3), observer)
        await stream.__anext__()
        value = int(await stream.athrow(Boom()))
        assert observer.ends == []  # handled: the stream goes on
        await stream.aclose()
        return value

    assert run(throw()) == -1
    assert observer.items == [0, -1] and len(observer.ends) == 1


def test_an_unhandled_athrow_ends_the_stream_with_that_exception() -> None:
    observer = Observer()
    error = KeyError("thrown")

    async def throw() -> None:
        stream = observe(numbers(3), observer)
        await stream.__anext__()
        await stream.athrow(error)

    with pytest.raises(KeyError) as raised:
        run(throw())
    assert raised.value is error and observer.ends == [error] and observer.lasts == [0]


def test_asend_reaches_the_generator() -> None:
    async def echo() -> AsyncIterator[Any]:
        received = None
        for _ in range(3):
            received = yield received

    observer = Observer()

    async def talk() -> list[Any]:
        stream = observe(echo(), observer)
        got = [await stream.__anext__()]
        got.append(await stream.asend("a"))
        got.append(await stream.asend("b"))
        with pytest.raises(StopAsyncIteration):
            await stream.asend("c")
        return got

    assert run(talk()) == [None, "a", "b"]
    assert observer.items == [None, "a", "b"] and observer.ends == [None]


def test_a_consumer_sees_an_async_generator() -> None:
    stream = observe(numbers(2), Observer())
    assert inspect.isasyncgen(stream)
    run(stream.aclose())
