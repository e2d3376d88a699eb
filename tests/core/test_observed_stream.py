"""The observed stream on a plain async generator: each way a stream ends finishes it once, and a
consumer sees the engine's generator (its items, exceptions, class and attributes).

The engines' own streams go through the same class in tests/reliability/test_streams.py
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
from otel_rollout.streams import ObservedAsyncStream


class Observer:
    def __init__(self) -> None:
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
        return [i async for i in ObservedAsyncStream(numbers(3), observer)]

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
        return [i async for i in ObservedAsyncStream(numbers(4), observer)]

    assert run(consume()) == [0, 1, 2, 3]
    assert observer.items == [0] and observer.ends == [None] and observer.lasts == [3]


def test_a_stream_that_yields_nothing_ends_with_no_last_item() -> None:
    observer = Observer()

    async def consume() -> list[int]:
        return [i async for i in ObservedAsyncStream(numbers(0), observer)]

    assert run(consume()) == [] and observer.ends == [None] and observer.lasts == [None]


def test_the_engines_exception_passes_unchanged() -> None:
    observer = Observer()
    stream = ObservedAsyncStream(numbers(1, fail=True), observer)

    async def consume() -> None:
        async for _ in stream:
            pass

    with pytest.raises(Boom, match="the engine's own") as raised:
        run(consume())
    assert observer.ends == [raised.value]


def test_aclose_and_abandon_finish_as_closed_early() -> None:
    closed, abandoned = Observer(), Observer()

    async def close_after_one() -> None:
        stream = ObservedAsyncStream(numbers(5), closed)
        await stream.__anext__()
        await stream.aclose()
        await stream.aclose()  # twice: still one finish

    run(close_after_one())
    assert len(closed.ends) == 1 and isinstance(closed.ends[0], StreamClosedEarly)
    ObservedAsyncStream(numbers(5), abandoned)  # never iterated, dropped
    gc.collect()
    assert len(abandoned.ends) == 1 and isinstance(abandoned.ends[0], StreamClosedEarly)


def test_athrow_reaches_the_generator_and_what_it_yields_is_observed() -> None:
    observer = Observer()

    async def throw() -> int:
        stream = ObservedAsyncStream(numbers(3), observer)
        await stream.__anext__()
        value = int(await stream.athrow(Boom()))
        assert observer.ends == []  # handled: the stream goes on
        await stream.aclose()
        return value

    assert run(throw()) == -1
    assert observer.items == [0, -1] and len(observer.ends) == 1


def test_a_consumer_sees_an_async_generator() -> None:
    inner = numbers(2)
    stream = ObservedAsyncStream(inner, Observer())
    assert inspect.isasyncgen(stream) and stream.__class__ is type(inner)
    assert stream.__wrapped__ is inner
    assert stream.ag_running is False and stream.ag_code.co_name == "numbers"
    assert isinstance(stream, ObservedAsyncStream)  # and our own class, for leak checks
    run(inner.aclose())
