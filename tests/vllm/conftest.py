from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from testkit.engines import VLLM_KWARGS, vllm_environment
from tests.conftest import OTelHarness, require_module


@pytest.fixture(scope="session")
def vllm_module() -> Any:
    vllm_environment()
    return require_module("vllm")


@pytest.fixture(scope="session")
def instrumented(otel_session: OTelHarness, vllm_module: Any) -> Iterator[Any]:
    from otel_rollout import VLLMInstrumentor

    instrumentor = VLLMInstrumentor()
    instrumentor.instrument()
    yield instrumentor
    instrumentor.uninstrument()


@pytest.fixture(scope="session")
def llm(vllm_module: Any, tiny_model: str, instrumented: Any) -> Any:
    """A plain LLM(): engine stats off, as vLLM defaults."""
    return vllm_module.LLM(model=tiny_model, **VLLM_KWARGS)


@pytest.fixture(scope="session")
def llm_stats(vllm_module: Any, tiny_model: str, instrumented: Any) -> Any:
    return vllm_module.LLM(model=tiny_model, disable_log_stats=False, **VLLM_KWARGS)
