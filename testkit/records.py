"""Hand-built request records with complete, checkable timelines, for tests and benchmarks."""

from __future__ import annotations

import time
from typing import Any

from otel_rollout.record import RequestRecord


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
