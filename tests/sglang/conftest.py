"""The real SGLang CPU engine, instrumented, with the tiny local model.

SGLang's CPU engine needs ``sgl_kernel``, which has no CPU build on PyPI; the test-environment
stand-in in ``testkit/sgl_kernel_standin`` provides the one op a plain generate reaches. It
goes on ``sys.path`` (this process) and ``PYTHONPATH`` (the engine's spawned scheduler and
detokenizer) before sglang is imported (``testkit.engines.sglang_environment``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.engines import sglang_environment, sglang_kwargs
from tests.conftest import OTelHarness, require_module


@pytest.fixture(scope="session")
def sglang_module() -> Any:
    sglang_environment()
    module = require_module("sglang")
    import sgl_kernel

    assert getattr(sgl_kernel, "IS_TEST_STANDIN", False), sgl_kernel.__file__
    return module


@pytest.fixture(scope="session")
def instrumented(otel_session: OTelHarness, sglang_module: Any) -> Iterator[Any]:
    from otel_rollout import SGLangInstrumentor

    instrumentor = SGLangInstrumentor()
    instrumentor.instrument()
    yield instrumentor
    instrumentor.uninstrument()


def start_engine(sglang_module: Any, model: str, **kwargs: Any) -> Any:
    return sglang_module.Engine(model_path=model, **sglang_kwargs(**kwargs))


@pytest.fixture(autouse=True)
def no_telemetry_failures(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Telemetry failures are swallowed (and logged once) by design; in tests they are bugs."""
    with caplog.at_level(logging.WARNING, logger="otel_rollout.telemetry"):
        yield
    failures = [
        r.getMessage()
        for r in caplog.records
        if r.name == "otel_rollout.telemetry" and r.levelno >= logging.WARNING
    ]
    assert not failures, failures
