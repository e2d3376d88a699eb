"""Engine-neutral fixtures: a Telemetry on the session's in-memory providers and hand-built records."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import pytest

from otel_rollout.config import RolloutConfig
from otel_rollout.record import RequestRecord
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


def make_record(model: str, **overrides: Any) -> RequestRecord:
    """A finished request with a complete, distinct timeline (all values chosen to be checkable)."""
    arrival = time.time_ns() - 5_000_000_000
    fields: dict[str, Any] = dict(
        provider="vllm",
        model=model,
        operation="text_completion",
        arrival_ns=arrival,
        scheduled_ns=arrival + 250_000_000,  # queue 0.25 s
        first_token_ns=arrival + 750_000_000,  # ttft 0.75 s
        finish_ns=arrival + 2_750_000_000,  # duration 2.75 s
        request_id="req-42",
        prompt_tokens=17,
        output_tokens=9,
        cached_tokens=3,
        finish_reasons=("length",),
        max_tokens=9,
        temperature=0.7,
        top_p=0.95,
        n=1,
    )
    fields.update(overrides)
    return RequestRecord(**fields)
