"""Trace and span ids that do not repeat when an engine seeds Python's ``random``.

vLLM (and most RL frameworks) call ``random.seed(0)`` when an engine starts. The SDK's default
``RandomIdGenerator`` draws from that same generator, so every rollout worker — and every run —
then produces the *same* sequence of trace ids: traces from different workers merge in the
backend and exemplars point at the wrong request. Ids from ``os.urandom`` are immune.
"""

from __future__ import annotations

import os

from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import INVALID_SPAN_ID, INVALID_TRACE_ID


class UrandomIdGenerator(IdGenerator):
    """Select with ``OTEL_PYTHON_ID_GENERATOR=rollout_urandom`` or pass to ``TracerProvider``."""

    def generate_span_id(self) -> int:
        while (value := int.from_bytes(os.urandom(8), "big")) == INVALID_SPAN_ID:
            pass
        return value

    def generate_trace_id(self) -> int:
        while (value := int.from_bytes(os.urandom(16), "big")) == INVALID_TRACE_ID:
            pass
        return value
