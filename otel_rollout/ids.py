"""Trace and span ids that do not repeat when an engine seeds Python's ``random``.

vLLM (and most RL frameworks) call ``random.seed(0)`` when an engine starts. The SDK's default
``RandomIdGenerator`` draws from that same generator, so every rollout worker — and every run —
then produces the *same* sequence of trace ids: traces from different workers merge in the
backend and exemplars point at the wrong request. Ids here come from a generator of this
module's own, seeded from ``os.urandom`` when the process starts and again in a forked child:
nobody else's ``seed()`` reaches it.

Not ``os.urandom`` for each id: it releases the GIL (a ``getrandom`` system call), and on a busy
event loop — a Ray actor serving thousands of calls with an exporter thread beside it —
getting the GIL back cost more than the rest of a request's bookkeeping (issue #40 item 7,
benchmarks/README.md figure 11).
"""

from __future__ import annotations

import os
import random
from typing import Any

from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import INVALID_SPAN_ID, INVALID_TRACE_ID

__all__ = ["UrandomIdGenerator"]

_RANDOM = random.Random(os.urandom(32))


def _reseed() -> None:
    """A forked child starts with its parent's state: without this both draw the same ids."""
    _RANDOM.seed(os.urandom(32))


os.register_at_fork(after_in_child=_reseed)


class UrandomIdGenerator(IdGenerator):
    """Select with ``OTEL_PYTHON_ID_GENERATOR=rollout_urandom`` or pass to ``TracerProvider``."""

    def generate_span_id(self) -> int:
        while (value := _RANDOM.getrandbits(64)) == INVALID_SPAN_ID:
            pass
        return value

    def generate_trace_id(self) -> int:
        while (value := _RANDOM.getrandbits(128)) == INVALID_TRACE_ID:
            pass
        return value


class PresetIds:
    """An id generator for the emitter's tracer that returns the ids the caller already chose.

    A request's trace and span ids are drawn on the caller's thread, when its record is handed
    over, so the step analysis, reports and Ray step reports have them at once — without waiting
    for the background emitter to make the span. The emitter thread sets them right before it
    starts the span; anything else falls through to the provider's own generator.
    """

    __slots__ = ("inner", "trace_id", "span_id")

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.trace_id = 0
        self.span_id = 0

    def generate_span_id(self) -> int:
        return self.span_id or int(self.inner.generate_span_id())

    def generate_trace_id(self) -> int:
        return self.trace_id or int(self.inner.generate_trace_id())

    def is_trace_id_random(self) -> bool:
        return bool(self.inner.is_trace_id_random())
