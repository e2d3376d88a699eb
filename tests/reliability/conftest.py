"""Reliability tests on the real vLLM engine: the vLLM fixtures, one AsyncLLM for the session."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.engines import VLLM_KWARGS, shutdown_async_llm
from tests.reliability.jobs import exporter_jobs  # noqa: F401


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Tests marked ``shuts_down_engine`` stop the session's AsyncLLM, so they run last."""
    last = [i for i in items if i.get_closest_marker("shuts_down_engine")]
    if last:
        items[:] = [i for i in items if i not in last] + last


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "shuts_down_engine: stops the shared AsyncLLM; runs last")


@pytest.fixture(scope="session")
def aloop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="session")
def async_engine(
    vllm_module: Any, tiny_model: str, instrumented: Any, llm: Any, aloop: asyncio.AbstractEventLoop
) -> Iterator[Any]:
    """One AsyncLLM (engine core in a child process) shared by every reliability test.

    It depends on ``llm`` only for teardown order: the in-process LLM's shutdown terminates a
    zmq context, which blocks forever while the AsyncLLM's sockets are still open, so the
    AsyncLLM must be shut down first (fixtures tear down in reverse order of setup).
    """
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    async def start() -> Any:
        return AsyncLLM.from_engine_args(AsyncEngineArgs(model=tiny_model, **VLLM_KWARGS))

    engine = aloop.run_until_complete(start())
    yield engine
    shutdown_async_llm(engine)
