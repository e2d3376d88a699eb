"""vLLM fixtures live in tests/conftest.py: the steps, e2e, reliability and compat suites use them too.

Here only what this suite's modules share: an ``AsyncLLM`` per module, on a loop of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.engines import VLLM_KWARGS, shutdown_async_llm


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def engine(
    vllm_module: Any, tiny_model: str, instrumented: Any, llm: Any, loop: asyncio.AbstractEventLoop
) -> Iterator[Any]:
    """An ``AsyncLLM``; depends on ``llm`` only so that it is torn down first (see
    shutdown_async_llm)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    async def start() -> Any:
        return AsyncLLM.from_engine_args(AsyncEngineArgs(model=tiny_model, **VLLM_KWARGS))

    engine = loop.run_until_complete(start())
    yield engine
    shutdown_async_llm(engine)
