"""Engine-neutral fixtures: a Telemetry on the session's in-memory providers and hand-built records."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from otel_rollout.config import RolloutConfig
from otel_rollout.telemetry import Telemetry
from tests.conftest import OTelHarness

_models = itertools.count()


@pytest.fixture
def make_telemetry(otel: OTelHarness) -> Callable[..., Telemetry]:
    """A Telemetry whose spans/metrics go to the harness; one meter scope per config."""

    def make(config: RolloutConfig | None = None, scope: str = "tests.core") -> Telemetry:
        return Telemetry(
            "vllm",
            otel.tracer_provider.get_tracer(scope),
            otel.meter_provider.get_meter(scope),
            config or RolloutConfig(),
        )

    return make


@pytest.fixture
def model() -> str:
    """A model name unique to the test, so the harness's per-name points never collide."""
    return f"core-model-{next(_models)}"
