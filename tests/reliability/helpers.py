"""What the reliability tests look at: our Telemetry's internal state, live objects, spans."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from otel_rollout.semconv import BATCH_SPAN_NAME
from otel_rollout.telemetry import Telemetry
from tests.conftest import OTelHarness


def in_flight(telemetry: Telemetry) -> dict[str, int]:
    """Our per-engine in-flight counts (the internal map the busy/idle counters read)."""
    return {model: activity.active for model, activity in telemetry._engines.items()}


def live(*classes: type) -> int:
    """How many instances of ``classes`` are alive after a full collection."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) in classes)


def request_spans(otel: OTelHarness) -> list[Any]:
    return [
        s
        for s in otel.finished_spans()
        if s.attributes.get("gen_ai.provider.name") == "vllm"
        and s.name not in (BATCH_SPAN_NAME, "rollout.step")
    ]


def batch_spans(otel: OTelHarness) -> list[Any]:
    return [s for s in otel.finished_spans() if s.name == BATCH_SPAN_NAME]


def active_delta(otel: OTelHarness) -> float:
    """rollout.requests.active relative to where it stood when the test began."""
    return sum(p.value for p in otel.metric_points("rollout.requests.active"))


def spin(loop: asyncio.AbstractEventLoop, seconds: float = 0.3) -> None:
    """Let the loop run finalizers (async generator aclose) and the engine's abort round trips."""
    loop.run_until_complete(asyncio.sleep(seconds))
